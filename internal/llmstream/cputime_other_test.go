//go:build !unix

package llmstream

import "time"

func cpuTime() time.Duration { return 0 }
