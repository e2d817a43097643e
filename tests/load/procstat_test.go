package load

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
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
// busy and idle since boot, and the part of busy the hypervisor gave to
// other guests (steal): a virtual machine's noisy neighbours, which slow
// every process without showing in any process's CPU time.
type machineCPU struct{ busy, idle, steal int64 }

func (m machineCPU) sub(o machineCPU) machineCPU {
	return machineCPU{m.busy - o.busy, m.idle - o.idle, m.steal - o.steal}
}

// stealShare is the stolen part of the ticks, 0 to 1.
func (m machineCPU) stealShare() float64 {
	if m.busy+m.idle <= 0 {
		return 0
	}
	return float64(m.steal) / float64(m.busy+m.idle)
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
	return parseMachineCPU(line)
}

// parseMachineCPU parses /proc/stat's "cpu" line.
func parseMachineCPU(line string) (machineCPU, error) {
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
		switch i {
		case 3, 4:
			m.idle += n
		case 7:
			m.steal = n
			m.busy += n
		default:
			m.busy += n
		}
	}
	return m, nil
}

func TestParseMachineCPU(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       machineCPU
		wantErr    bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"steal counted busy and apart", "cpu  423351 0 89802 3352319 3991 0 4927 10274 0 0", machineCPU{busy: 423351 + 89802 + 4927 + 10274, idle: 3352319 + 3991, steal: 10274}, false},
		{"no steal", "cpu 10 1 2 30 4 0 3 0", machineCPU{busy: 16, idle: 34}, false},
		{"too short", "cpu 1 2 3", machineCPU{}, true},
		{"not the cpu line", "intr 1 2 3 4 5 6 7 8", machineCPU{}, true},
		{"not a number", "cpu 1 2 3 x 5 6 7 8", machineCPU{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMachineCPU(tc.line)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("parseMachineCPU(%q) = %+v, %v; want %+v, error %v", tc.line, got, err, tc.want, tc.wantErr)
			}
		})
	}
	d := machineCPU{busy: 900, idle: 100, steal: 110}
	if got := d.stealShare(); got != 0.11 {
		t.Errorf("stealShare = %v, want 0.11", got)
	}
}
