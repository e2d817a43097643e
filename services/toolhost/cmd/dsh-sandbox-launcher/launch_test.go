package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher"
)

// stages builds the launcher both ways: with cgo (the C first stage, as
// make build and the Dockerfile build it) and without (the Go launcher),
// and checks that each build says which stage serves it.
func stages(t *testing.T) map[string]string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go toolchain not on PATH")
	}
	out := map[string]string{}
	for stage, cgo := range map[string]bool{"c": true, "go": false} {
		if cgo && !proctest.CgoUsable() {
			t.Logf("no C compiler: the C first stage is not built here")
			continue
		}
		// Executable by nobody too (the caps-nobody case).
		dir := t.TempDir()
		for _, d := range []string{filepath.Dir(dir), dir} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		bin := filepath.Join(dir, launcher.Arg0)
		if err := proctest.BuildLauncher(bin, cgo); err != nil {
			t.Fatal(err)
		}
		b, _ := exec.Command(bin).CombinedOutput()
		if !strings.Contains(string(b), "(first stage: "+stage+")") {
			t.Fatalf("the cgo=%v build says %q, want first stage %s", cgo, b, stage)
		}
		out[stage] = bin
	}
	return out
}

// run is one launch: the status lines, the shell's stdout and stderr, the
// launcher's exit code.
type run struct {
	status, stdout, stderr string
	code                   int
}

// launch runs bin with argv (argv[0] included) the way the sandbox does:
// the status pipe as descriptor 3, its own process group, and with pidns a
// PID and mount namespace of its own; set, when not nil, adjusts how it is
// started (credentials, capabilities). signal, when set, is sent to the
// launcher once the shell printed "ready".
func launch(t *testing.T, bin string, argv []string, pidns bool, set func(*syscall.SysProcAttr), signal syscall.Signal) run {
	t.Helper()
	sr, sw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Close()
	or, ow, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	attr := &syscall.SysProcAttr{Setpgid: true}
	if pidns {
		attr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
	}
	if set != nil {
		set(attr)
	}
	// Descriptor 5 is one the launcher inherits without close-on-exec
	// (4, the ruleset, is absent): it must not reach the shell.
	inherited, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer inherited.Close()
	cmd := &exec.Cmd{Path: bin, Args: argv, Stdout: ow, Stderr: &errb, ExtraFiles: []*os.File{sw, nil, inherited}, SysProcAttr: attr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sw.Close()
	ow.Close()
	var out strings.Builder
	sc := bufio.NewScanner(or)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if sc.Text() == "ready" && signal != 0 {
			_ = cmd.Process.Signal(signal)
		}
	}
	or.Close()
	_ = cmd.Wait()
	st := new(strings.Builder)
	_, _ = bufio.NewReader(sr).WriteTo(st)
	return run{status: st.String(), stdout: out.String(), stderr: errb.String(), code: cmd.ProcessState.ExitCode()}
}

// TestFirstStagesAgree: the C first stage and the Go launcher serve the
// protocol alike — status lines, exit codes, the shell's limits, directory,
// descriptors, namespace and capabilities, signal forwarding and the
// containment of leftovers — and each matches what the sandbox relies on.
func TestFirstStagesAgree(t *testing.T) {
	root := os.Geteuid() == 0
	bins := stages(t)
	dir := t.TempDir()
	limits := launcher.Limits{CPUSeconds: 7, MemoryBytes: 3 << 30, Processes: 50, FileBytes: 1 << 20}
	args := func(cmd string, f func(*launcher.Config)) []string {
		c := launcher.Config{Argv: []string{"bash", "-c", cmd}, Dir: dir, Limits: limits}
		if f != nil {
			f(&c)
		}
		return c.Args()
	}
	pidns := func(c *launcher.Config) { c.PIDNS, c.DropCaps = true, true }
	// The shell's capability sets, as hex masks.
	capSets := `awk '/^Cap(Inh|Prm|Eff|Amb)/ {printf "%s%s ", $1, $2}' /proc/self/status`
	// Started holding CAP_SYS_ADMIN and CAP_SYS_PTRACE inheritable and
	// ambient (setpriv --inh-caps, a host with ambient capabilities), as
	// root or as nobody.
	withCaps := func(nobody bool) func(*syscall.SysProcAttr) {
		return func(a *syscall.SysProcAttr) {
			a.AmbientCaps = []uintptr{21, 19} // CAP_SYS_ADMIN, CAP_SYS_PTRACE
			if nobody {
				a.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
			}
		}
	}
	// As root with dropcaps the shell keeps root's other capabilities but
	// neither of these in any set; as nobody it holds none at all.
	capsRoot := func(c *launcher.Config) {
		c.DropCaps = true
		c.Argv[2] = capSets + ` | tr ' ' '\n' | while read l; do v=0x${l#*:}; echo ${l%%:*} $(( (v >> 21) & 1 ))$(( (v >> 19) & 1 )); done`
	}
	capsNobody := func(c *launcher.Config) { c.Dir = "/"; c.Argv[2] = capSets }
	marker := fmt.Sprintf("dsh-first-stage-%d", time.Now().UnixNano())
	tests := []struct {
		name   string
		argv   []string
		pidns  bool
		root   bool // needs root: skipped otherwise
		set    func(*syscall.SysProcAttr)
		signal syscall.Signal
		want   run
	}{
		{name: "exit", argv: args("echo hi; exit 3", nil), want: run{status: "ok\nexit 3\n", stdout: "hi\n", code: 3}},
		{name: "killed", argv: args("kill -KILL $$", nil), want: run{status: "ok\nsignal 9\n", code: 137}},
		{name: "limits", argv: args("ulimit -t; ulimit -v; ulimit -f; ulimit -c; pwd", nil),
			want: run{status: "ok\nexit 0\n", stdout: fmt.Sprintf("7\n%d\n%d\n0\n%s\n", (3<<30)/1024, (1<<20)/1024, dir), code: 0}},
		// Only the standard descriptors reach the shell (3 is ls's own
		// directory), not even one the launcher itself inherited (5).
		{name: "descriptors", argv: args("ls /proc/self/fd | tr '\\n' ' '", nil), want: run{status: "ok\nexit 0\n", stdout: "0 1 2 3 \n"}},
		// A setting error names the setting (as strconv.Quote writes it).
		{name: "unknown-setting", argv: []string{launcher.Arg0, "dsh-launch-v2", "bogus", "--", "true"}, want: run{status: "error: config: unknown setting \"bogus\"\n", code: 125}},
		{name: "unknown-setting-quoted", argv: []string{launcher.Arg0, "dsh-launch-v2", "a\"b\\c\td\x01", "--", "true"}, want: run{status: "error: config: unknown setting \"a\\\"b\\\\c\\td\\x01\"\n", code: 125}},
		{name: "no-command", argv: []string{launcher.Arg0, "dsh-launch-v2", "dir=/", "--"}, want: run{code: 125}},
		{name: "missing-command", argv: func() []string { a := args("", nil); return append(a[:len(a)-3], "/nonexistent/bash") }(), want: run{code: 125}},
		{name: "bad-dir", argv: args("true", func(c *launcher.Config) { c.Dir = dir + "/missing" }), want: run{code: 125}},
		// Pid 1 of its own namespace with its own /proc, capabilities
		// that could undo the confinement gone from the shell.
		{name: "pidns", argv: args(`echo $PPID; test -e /proc/`+strconv.Itoa(os.Getpid())+` && echo host-proc; b=$(awk '/^CapBnd/ {print $2}' /proc/self/status); echo $(( (0x$b >> 21) & 1 )) $(( (0x$b >> 19) & 1 ))`, pidns),
			pidns: true, root: true, want: run{status: "ok\nexit 0\n", stdout: "1\n0 0\n"}},
		// Inheritable and ambient capabilities do not survive into the
		// shell: for root exec grants inheritable ∪ bounding, for anyone
		// else the ambient set.
		{name: "caps-root", argv: args("", capsRoot), root: true, set: withCaps(false),
			want: run{status: "ok\nexit 0\n", stdout: "CapInh 00\nCapPrm 00\nCapEff 00\nCapAmb 00\n"}},
		{name: "caps-nobody", argv: args("", capsNobody), root: true, set: withCaps(true),
			want: run{status: "ok\nexit 0\n", stdout: "CapInh:0000000000000000 CapPrm:0000000000000000 CapEff:0000000000000000 CapAmb:0000000000000000 \n"}},
		// A termination signal to the launcher reaches the shell.
		{name: "forward", argv: args("trap 'echo got; exit 5' TERM; echo ready; sleep 100 & wait", nil), signal: syscall.SIGTERM,
			want: run{status: "ok\nexit 5\n", stdout: "ready\ngot\n", code: 5}},
		{name: "forward-pidns", argv: args("trap 'echo got; exit 5' TERM; echo ready; sleep 100 & wait", pidns), pidns: true, root: true, signal: syscall.SIGTERM,
			want: run{status: "ok\nexit 5\n", stdout: "ready\ngot\n", code: 5}},
		// Without a namespace the launcher is a subreaper and kills what
		// the shell left behind.
		{name: "leftovers", argv: args("setsid bash -c 'exec -a "+marker+" sleep 300' & ( ( exec -a "+marker+" sleep 300 ) & ); echo started", nil),
			want: run{status: "ok\nexit 0\n", stdout: "started\n"}},
	}
	results := map[string]map[string]run{}
	for stage, bin := range bins {
		results[stage] = map[string]run{}
		for _, tc := range tests {
			if tc.root && !root {
				t.Logf("%s %s: needs root (namespaces, capabilities), skipped", stage, tc.name)
				continue
			}
			got := launch(t, bin, tc.argv, tc.pidns, tc.set, tc.signal)
			results[stage][tc.name] = got
			if tc.want.code == 125 {
				if got.code != 125 || !strings.HasPrefix(got.status, "error: ") || strings.Count(got.status, "\n") != 1 ||
					tc.want.status != "" && got.status != tc.want.status {
					t.Errorf("%s %s: want one error line (%q) and exit 125, got %+v", stage, tc.name, tc.want.status, got)
				}
				continue
			}
			if got.status != tc.want.status || got.stdout != tc.want.stdout || got.code != tc.want.code {
				t.Errorf("%s %s:\n got %+v\nwant %+v", stage, tc.name, got, tc.want)
			}
		}
		if pids := living(t, marker); pids != "" {
			t.Errorf("%s: leftovers %s still running after the launcher returned", stage, pids)
		}
	}
	// Setup errors name the same step.
	if len(results) == 2 {
		for _, tc := range tests {
			c, g := results["c"][tc.name], results["go"][tc.name]
			if tc.want.code == 125 && strings.SplitN(c.status, ":", 3)[1] != strings.SplitN(g.status, ":", 3)[1] {
				t.Errorf("%s: the stages name different steps: c %q, go %q", tc.name, c.status, g.status)
			}
		}
	}
}

// living lists the processes whose command line holds marker (pgrep: this
// test binary stays free of the net package, whose resolver a static cgo
// link warns about).
func living(t *testing.T, marker string) string {
	t.Helper()
	if _, err := exec.LookPath("pgrep"); err != nil {
		t.Log("no pgrep: leftovers not checked")
		return ""
	}
	out, _ := exec.Command("pgrep", "-f", marker).Output()
	return strings.TrimSpace(string(out))
}
