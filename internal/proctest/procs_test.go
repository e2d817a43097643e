package proctest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStatFields: field n is at [n-3] whatever the command name holds
// (spaces, parentheses), and a pid with no /proc entry is an error.
func TestStatFields(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep on PATH")
	}
	raw, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(t.TempDir(), "a) b (c")
	if err := os.WriteFile(odd, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(odd, "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	tests := []struct {
		name string
		pid  int
		ppid int
	}{
		{"this process", os.Getpid(), os.Getppid()},
		{"a command name with ') ('", cmd.Process.Pid, os.Getpid()},
	}
	for _, tt := range tests {
		f, err := StatFields(tt.pid)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := f[4-3]; got != strconv.Itoa(tt.ppid) {
			t.Errorf("%s: ppid (field 4) %q, want %d", tt.name, got, tt.ppid)
		}
	}
	if _, err := StatFields(-1); err == nil {
		t.Error("StatFields(-1) returned no error")
	}
}

// TestLivingSkipsZombies: a process that exited and was not reaped is not
// living. (A zombie's cmdline reads empty, so the marker already misses
// it; the state check covers one that exits between the two reads.)
func TestLivingSkipsZombies(t *testing.T) {
	const marker = "proctest-zombie-marker"
	cmd := exec.Command("sh", "-c", `read x`, marker)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("no sh: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if got := Living(marker); len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Fatalf("Living(%q) = %v, want [%d]", marker, got, cmd.Process.Pid)
	}
	_ = in.Close() // sh reads EOF and exits
	// Wait for the exit without reaping it (WNOWAIT): the child stays a
	// zombie.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if f, err := StatFields(cmd.Process.Pid); err != nil || f[0] != "Z" {
		t.Fatalf("the exited child's stat: %v, %v; want state Z", f, err)
	}
	if got := Living(marker); len(got) != 0 {
		t.Errorf("Living(%q) = %v after the process exited, want none", marker, got)
	}
}
