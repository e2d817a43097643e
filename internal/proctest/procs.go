package proctest

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

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
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(st)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}
