//go:build linux

package hugeheap

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// thpMadvise skips unless the package is active: the kernel's
// transparent-huge-page mode is "madvise", the mode in which only a marked
// range gets huge pages (under "always" every range does, under "never"
// none: nothing to tell apart), GODEBUG does not opt out, pointers are
// 64-bit (init).
func thpMadvise(t *testing.T) {
	t.Helper()
	if !active {
		b, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
		t.Skipf("hugeheap is inactive here (THP mode %q, GODEBUG=disablethp=1 or a 32-bit build)", strings.TrimSpace(string(b)))
	}
}

// mapping is what /proc/self/smaps says of the mapping holding addr.
type mapping struct {
	flags     []string
	hugeBytes int64 // AnonHugePages
}

func mappingOf(t *testing.T, addr uintptr) mapping {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m mapping
	in, found := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok && !strings.HasSuffix(fields[0], ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && uintptr(l) <= addr && addr < uintptr(h)
			found = found || in
			continue
		}
		if !in {
			continue
		}
		switch fields[0] {
		case "AnonHugePages:":
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			m.hugeBytes = kb << 10
		case "VmFlags:":
			m.flags = fields[1:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("no mapping holds %#x", addr)
	}
	return m
}

func (m mapping) has(flag string) bool { return slices.Contains(m.flags, flag) }

// kept holds every object grow made, so that none is freed and its memory
// reused by a later one (-count=N runs the test again in the process).
var kept [][]byte

// grow allocates a new 16 MiB object, larger than anything free in this
// test binary's heap, so the runtime maps new memory for it that nothing
// has touched yet.
func grow() []byte {
	b := make([]byte, 16<<20)
	kept = append(kept, b)
	return b
}

// touch writes one byte per 4 KiB page, faulting each in.
func touch(b []byte) {
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
}

func TestAdviseBacksNewHeapWithHugePages(t *testing.T) {
	thpMadvise(t)
	End()

	// Unmarked (End took back what this package's init marked; the
	// kernel's default in madvise mode is the same): touching a new object
	// makes no huge page.
	plain := grow()
	before := mappingOf(t, uintptr(unsafe.Pointer(&plain[0]))).hugeBytes
	touch(plain)
	if m := mappingOf(t, uintptr(unsafe.Pointer(&plain[0]))); m.hugeBytes != before || m.has("hg") {
		t.Fatalf("an unmarked heap object touched page by page made %d bytes of huge pages (flags %v)", m.hugeBytes-before, m.flags)
	}

	// Marked after the runtime mapped it, before it was touched: huge.
	// Under a loaded machine (the whole suite on two cores) the kernel
	// sometimes makes no huge page for an object without counting a
	// fallback or an allocation at all; a fresh object is tried then, up
	// to three, and the test fails only where the kernel did make huge
	// pages (thp_fault_alloc rose) but none for the marked heap.
	var marked []byte
	var m mapping
	var made int64
	allocs := vmstat(t, "thp_fault_alloc")
	for try := 0; try < 3; try++ {
		marked = grow()
		Advise()
		before = mappingOf(t, uintptr(unsafe.Pointer(&marked[0]))).hugeBytes
		fallbacks := vmstat(t, "thp_fault_fallback")
		touch(marked)
		m = mappingOf(t, uintptr(unsafe.Pointer(&marked[0])))
		if !m.has("hg") {
			t.Fatalf("Advise left the new heap mapping unmarked: flags %v", m.flags)
		}
		if made = m.hugeBytes - before; made >= 4<<20 {
			break
		}
		if vmstat(t, "thp_fault_fallback") > fallbacks {
			End()
			t.Skipf("the kernel declined huge pages (no free 2 MiB page): %d bytes made", made)
		}
	}
	if made < 4<<20 {
		if vmstat(t, "thp_fault_alloc") == allocs {
			End()
			t.Skipf("the kernel made no huge page at all in three tries (none allocated, none declined): %d bytes made", made)
		}
		t.Errorf("a marked 16 MiB heap object touched page by page made %d bytes of huge pages, want at least 4 MiB", made)
	}

	// End takes the mark back: no huge pages made there from now on (and
	// khugepaged leaves the mapping alone); those already made stay.
	End()
	m = mappingOf(t, uintptr(unsafe.Pointer(&marked[0])))
	if m.has("hg") || !m.has("nh") {
		t.Errorf("after End the mapping's flags are %v, want nh and no hg", m.flags)
	}
	End() // a second End is harmless
}

// BenchmarkAdvise is what one call costs a start (the runtime's metrics
// read and one madvise over the heap's arenas).
func BenchmarkAdvise(b *testing.B) {
	for b.Loop() {
		Advise()
	}
	End()
}

// vmstat is one counter of /proc/vmstat.
func vmstat(t *testing.T, name string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == name {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("/proc/vmstat has no %s", name)
	return 0
}
