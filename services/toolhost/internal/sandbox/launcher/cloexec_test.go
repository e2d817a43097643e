package launcher

import (
	"testing"

	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher/cloexectest"
)

// TestCloexecWalk: the fallback for kernels without CLOSE_RANGE_CLOEXEC
// marks an inherited descriptor close-on-exec.
func TestCloexecWalk(t *testing.T) { cloexectest.Check(t, cloexecWalk) }
