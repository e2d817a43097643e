// Package hugeheap asks Linux to back the Go heap with transparent huge
// pages while a short-lived process starts, and takes the request back when
// the start is over (docs/arch/throughput.md §30).
//
// Go maps its heap in 4 MiB chunks of anonymous memory and, since Go
// 1.21.1, leaves their page size to the kernel, which on a machine whose
// transparent-huge-page mode is "madvise" (a common distribution default,
// and this project's build machine) means 4 KiB pages: every heap page a
// start touches first is a page fault. `dsh dev -p` took ~1,000 of them on
// the heap before its first model request, ~15 µs of CPU each on the
// two-core VM it was measured on. Advise marks the heap's address range
// MADV_HUGEPAGE, so a 2 MiB region of it that the heap has not touched yet
// is faulted in once, as one huge page.
//
// It acts only where the machine's mode is "madvise" (read once, at init):
// under "always" the heap has huge pages without it, and End's
// MADV_NOHUGEPAGE would take them away; under "never" nothing changes.
// It is a hint and never changes what memory holds: the kernel may decline
// it (no free huge page), a region already partly touched
// keeps its small pages, and memory the runtime maps after a call is a new
// mapping without the mark — so a start calls Advise again as it goes. End
// marks the same ranges MADV_NOHUGEPAGE, so that in a process that keeps
// running khugepaged does not later fill partly used regions out to whole
// huge pages (the memory growth that made Go stop asking for huge pages).
//
// The package marks the heap once as it is initialised (its init runs
// before most other packages' inits allocate), so importing it is enough
// for a process's first allocations; the marks are process state, like the
// heap itself. Elsewhere than Linux both calls do nothing.
package hugeheap
