package load

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsh-dev/dsh/internal/proctest"
)

// clockTick is USER_HZ, the unit of /proc/PID/stat's CPU fields (100 on
// every Linux this runs on).
const clockTick = 100

// cpu is a process's CPU time from /proc/PID/stat: its own (all threads)
// and that of its reaped children (the tool processes of a toolhost), and
// its own minor page faults (a first touch of memory the kernel maps in:
// ~20 µs of CPU each on the VMs this runs on, docs/arch/throughput.md §26).
type cpu struct {
	self, children time.Duration
	faults         int64
}

func (c cpu) sub(o cpu) cpu {
	return cpu{c.self - o.self, c.children - o.children, c.faults - o.faults}
}

// readCPU reads /proc/PID/stat.
func readCPU(pid int) (cpu, error) {
	f, err := proctest.StatFields(pid)
	if err != nil {
		return cpu{}, err
	}
	// minflt(10) ... utime(14) stime(15) cutime(16) cstime(17): field n is
	// f[n-3].
	var v [18]int64
	for _, n := range []int{10, 14, 15, 16, 17} {
		if v[n], err = strconv.ParseInt(f[n-3], 10, 64); err != nil {
			return cpu{}, fmt.Errorf("/proc/%d/stat: field %d: %w", pid, n, err)
		}
	}
	tick := func(n int) time.Duration { return time.Duration(v[n]) * time.Second / clockTick }
	return cpu{self: tick(14) + tick(15), children: tick(16) + tick(17), faults: v[10]}, nil
}

// peakRSS reads VmHWM (the peak resident set) of pid, in KiB.
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// machineCPU is the first line of /proc/stat: the ticks all cores spent
// busy and idle since boot.
type machineCPU struct{ busy, idle int64 }

func (m machineCPU) sub(o machineCPU) machineCPU {
	return machineCPU{m.busy - o.busy, m.idle - o.idle}
}

// share is the busy part of the ticks, 0 to 1.
func (m machineCPU) share() float64 {
	if m.busy+m.idle <= 0 {
		return 0
	}
	return float64(m.busy) / float64(m.busy+m.idle)
}

// readMachineCPU reads the "cpu" line of /proc/stat: user nice system
// idle iowait irq softirq steal ...; idle and iowait count as idle, steal
// as busy (the cores were not ours to use).
func readMachineCPU() (machineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var m machineCPU
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("/proc/stat: field %d: %w", i+1, err)
		}
		if i == 3 || i == 4 {
			m.idle += n
		} else {
			m.busy += n
		}
	}
	return m, nil
}
