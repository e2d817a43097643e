package load

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/PID/stat's CPU fields (100 on
// every Linux this runs on).
const clockTick = 100

// cpu is a process's CPU time from /proc/PID/stat: its own (all threads)
// and that of its reaped children (the tool processes of a toolhost).
type cpu struct{ self, children time.Duration }

func (c cpu) sub(o cpu) cpu { return cpu{c.self - o.self, c.children - o.children} }

// readCPU reads /proc/PID/stat.
func readCPU(pid int) (cpu, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpu{}, err
	}
	// The command name is in parentheses and may hold spaces: split after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// After the name: state(3) ... utime(14) stime(15) cutime(16) cstime(17),
	// so field n is f[n-3].
	if len(f) < 15 {
		return cpu{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	tick := func(n int) time.Duration {
		v, _ := strconv.ParseInt(f[n-3], 10, 64)
		return time.Duration(v) * time.Second / clockTick
	}
	return cpu{self: tick(14) + tick(15), children: tick(16) + tick(17)}, nil
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
