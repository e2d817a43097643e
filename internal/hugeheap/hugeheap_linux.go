//go:build linux

package hugeheap

import (
	"bytes"
	"os"
	"runtime/metrics"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// arenaBytes is the Go runtime's heap arena on 64-bit Linux
// (runtime.heapArenaBytes): the heap is reserved and mapped inside arenas
// aligned to it. Go 1.26 starts the heap at a random 4 MiB chunk of its
// first arena (up to 60 MiB above the arena's base), so a start's heap
// often reaches into the next arena. On a 32-bit build the arena is 4 MiB
// and the heap sits beside the binary's own mappings: the package does
// nothing there (see init).
const arenaBytes = 64 << 20

var (
	mu sync.Mutex
	// lo and hi bound the one range marked MADV_HUGEPAGE and not taken
	// back (lo == hi: none): every Advise widens it, End takes it back in
	// one call.
	lo, hi uintptr
	// active is whether a mark changes anything: the machine's
	// transparent-huge-page mode is "madvise" (under "always" the heap
	// gets huge pages anyway, and End's MADV_NOHUGEPAGE would take them
	// away from a long-running process; under "never" nothing does), the
	// user has not opted the runtime out of huge pages
	// (GODEBUG=disablethp=1), and pointers are 64-bit. Decided once, at
	// init.
	active bool
)

func init() {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	active = err == nil && bytes.Contains(b, []byte("[madvise]")) &&
		!strings.Contains(os.Getenv("GODEBUG"), "disablethp=1") && unsafe.Sizeof(uintptr(0)) == 8
	Advise()
}

// Advise marks the heap MADV_HUGEPAGE: from the arena holding a fresh
// allocation (the lowest such arena seen, when the heap has grown into a
// higher one since) up to as far as all the memory the runtime has mapped
// and one arena more reach (the random start chunk, above).
func Advise() {
	if !active {
		return
	}
	base := uintptr(unsafe.Pointer(fresh())) &^ (arenaBytes - 1)
	sample := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(sample)
	var mapped uintptr
	if sample[0].Value.Kind() == metrics.KindUint64 {
		mapped = uintptr(sample[0].Value.Uint64())
	}
	n := (mapped+arenaBytes-1)&^(arenaBytes-1) + arenaBytes
	mu.Lock()
	defer mu.Unlock()
	switch {
	case lo == hi:
		lo, hi = base, base+n
	case base < lo && lo-base <= n: // below, within reach of the heap's size
		lo = base
	}
	hi = max(hi, base+n)
	// Parts of the range that are not mapped make madvise report ENOMEM
	// after it marked the rest; nothing else is worth reporting for a hint.
	_ = madvise(lo, hi-lo, syscall.MADV_HUGEPAGE)
}

// End marks the range Advise marked MADV_NOHUGEPAGE, in one call: huge
// pages already faulted in stay, no further ones are made there.
func End() {
	mu.Lock()
	defer mu.Unlock()
	if lo != hi {
		_ = madvise(lo, hi-lo, syscall.MADV_NOHUGEPAGE)
	}
	lo, hi = 0, 0
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
