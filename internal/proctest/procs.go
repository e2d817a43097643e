package proctest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// statFields is how many fields /proc/<pid>/stat has after the command
// name at the least: fields 3 (state) to 44 (cguest_time), which every
// Linux since 2.6.24 writes.
const statFields = 42

// StatFields returns the fields of /proc/<pid>/stat after the command
// name (proc(5) numbers them from 1: pid, (comm), state, ...), so that
// field n is at [n-3]: state at [0], minflt (10) at [7], utime (14) at
// [11]. The command name is in parentheses and may hold spaces and
// parentheses itself, so the fields start after its last ')'.
func StatFields(pid int) ([]string, error) {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("%s: no command name in %q", path, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < statFields {
		return nil, fmt.Errorf("%s: %d fields after the command name, want at least %d", path, len(f), statFields)
	}
	return f, nil
}

// Living returns the pids (as this process's /proc sees them) of the live,
// non-zombie processes whose command line contains marker. Tests start the
// processes they want to find with the marker in an argument (`sleep 300 #
// marker` does not work; `exec -a marker sleep 300` or `sh -c '...' marker`
// do), because a confined call's own pids mean nothing outside it.
func Living(marker string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmd, []byte(marker)) {
			continue
		}
		if st, err := StatFields(pid); err != nil || st[0] == "Z" {
			continue
		}
		out = append(out, pid)
	}
	return out
}
