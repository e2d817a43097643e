//go:build linux

package hugeheap

import (
	"bytes"
	"os"
	"runtime/metrics"
	"slices"
	"sync"
	"syscall"
	"unsafe"
)

// arenaBytes is the Go runtime's heap arena on 64-bit Linux
// (runtime.heapArenaBytes): the heap is reserved and mapped inside arenas
// aligned to it, and a heap that outgrows one continues in the next one up.
// Were it another size, Advise would mark a range beside the heap: harmless,
// it only loses its effect.
const arenaBytes = 64 << 20

// mark is one marked range.
type mark struct{ base, n uintptr }

var (
	mu     sync.Mutex
	marked []mark // marked MADV_HUGEPAGE and not taken back
	// madviseMode is whether the machine's transparent-huge-page mode is
	// "madvise", the one mode where a mark changes anything: under
	// "always" the heap gets huge pages anyway (and End's
	// MADV_NOHUGEPAGE would take them away from a long-running process),
	// under "never" nothing does. Read once, at init.
	madviseMode bool
)

func init() {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	madviseMode = err == nil && bytes.Contains(b, []byte("[madvise]"))
	Advise()
}

// Advise marks the heap MADV_HUGEPAGE: from the arena holding a fresh
// allocation upward, as far as all the memory the runtime has mapped and
// one arena more reach (the heap grows upward into the next arena).
func Advise() {
	if !madviseMode {
		return
	}
	base := uintptr(unsafe.Pointer(fresh())) &^ (arenaBytes - 1)
	sample := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(sample)
	var mapped uintptr
	if sample[0].Value.Kind() == metrics.KindUint64 {
		mapped = uintptr(sample[0].Value.Uint64())
	}
	m := mark{base, (mapped+arenaBytes-1)&^(arenaBytes-1) + arenaBytes}
	mu.Lock()
	defer mu.Unlock()
	// Parts of the range that are not mapped make madvise report ENOMEM
	// after it marked the rest; nothing else is worth reporting for a hint.
	_ = madvise(m.base, m.n, syscall.MADV_HUGEPAGE)
	if !slices.Contains(marked, m) {
		marked = append(marked, m)
	}
}

// End marks every range Advise marked MADV_NOHUGEPAGE: huge pages already
// faulted in stay, no further ones are made there.
func End() {
	mu.Lock()
	defer mu.Unlock()
	for _, m := range marked {
		_ = madvise(m.base, m.n, syscall.MADV_NOHUGEPAGE)
	}
	marked = marked[:0]
}

// fresh is a new heap allocation (not inlined, so that it escapes).
//
//go:noinline
func fresh() *[64]byte { return new([64]byte) }

func madvise(addr, n uintptr, advice int) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, addr, n, uintptr(advice)); errno != 0 {
		return errno
	}
	return nil
}
