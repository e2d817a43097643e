package sandbox

import "github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher"

// Limits are the per-call resource limits (see launcher.Limits).
type Limits = launcher.Limits

// The default limits.
const (
	DefaultCPUSeconds  = launcher.DefaultCPUSeconds
	DefaultMemoryBytes = launcher.DefaultMemoryBytes
	DefaultProcesses   = launcher.DefaultProcesses
	DefaultFileBytes   = launcher.DefaultFileBytes
)
