// Package launcher is the confined-call launcher the sandbox package
// re-executes: the toolhost binary started with argv[0] = Arg0 and a JSON
// Config in argv[1]. It sits in its own package with few dependencies
// because its init runs before the rest of the binary initialises: only the
// packages it imports are initialised first, so each call pays for a Go
// runtime start, not for the toolhost's proto registries and gRPC.
package launcher

// Keep the imports few and free of path/filepath: Go initialises packages
// in import-path order as their dependencies become ready, and one import
// that sorts late (path/filepath did) lets the proto registries initialise
// first.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	"golang.org/x/sys/unix"
)

// Arg0 is the argv[0] marker that turns the toolhost binary into the
// launcher; argv[1] is the JSON Config.
const Arg0 = "dsh-sandbox-launcher"

// statusFD is the launcher's report pipe to the toolhost: one "ok" or
// "error: <msg>" line once set up, then "exit N" or "signal N".
const statusFD = 3

// setupFailed is the launcher's exit code when it could not confine itself.
const setupFailed = 125

// The launcher runs before the rest of the binary initialises: this init
// (the package is imported by every binary that embeds the toolhost) sees
// the marker and never returns. Deliberately an init rather than a hook in
// main: main runs only after every package's init.
func init() {
	if len(os.Args) == 2 && os.Args[0] == Arg0 {
		os.Exit(launch(os.Args[1]))
	}
}

// Config is what the toolhost tells the launcher; nothing in it is secret
// (the tool can read it from /proc/1/cmdline).
type Config struct {
	Landlock bool     `json:"landlock,omitempty"`
	Network  bool     `json:"network,omitempty"`
	Argv     []string `json:"argv"`
	Dir      string   `json:"dir"`
	// Hidden are roots whose contents are unreadable, except Read and Write.
	Hidden []string `json:"hidden,omitempty"`
	// Read are extra readable directories (inside Hidden).
	Read []string `json:"read,omitempty"`
	// Write are writable directories.
	Write []string `json:"write,omitempty"`
	// Cgroup is a cgroup directory to join before anything runs.
	Cgroup string `json:"cgroup,omitempty"`
	// PIDNS says the launcher is pid 1 of its own PID and mount namespace.
	PIDNS    bool   `json:"pidns,omitempty"`
	DropCaps bool   `json:"drop_caps,omitempty"`
	Limits   Limits `json:"limits"`
}

func launch(arg string) int {
	status := os.NewFile(statusFD, "status")
	fail := func(format string, args ...any) int {
		fmt.Fprintf(status, "error: "+format+"\n", args...)
		return setupFailed
	}
	var cfg Config
	if err := json.Unmarshal([]byte(arg), &cfg); err != nil {
		return fail("config: %v", err)
	}
	if _, err := unix.FcntlInt(statusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fail("status pipe: %v", err)
	}
	if cfg.Cgroup != "" {
		if err := os.WriteFile(cfg.Cgroup+"/cgroup.procs", []byte("0"), 0); err != nil {
			return fail("join cgroup %s: %v", cfg.Cgroup, err)
		}
	}
	if cfg.PIDNS {
		// Our own /proc: it lists only this call's processes, so no
		// ancestor's environ or memory is even addressable.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fail("make mounts private: %v", err)
		}
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fail("mount /proc: %v", err)
		}
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail("subreaper: %v", err)
	}
	if cfg.DropCaps {
		if err := dropCaps(); err != nil {
			return fail("%v", err)
		}
	}
	if cfg.Landlock {
		if err := restrict(cfg); err != nil {
			return fail("landlock: %v", err)
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	shell, err := startLimited(cfg)
	if err != nil {
		return fail("%v", err)
	}
	fmt.Fprintln(status, "ok")
	go func() {
		for s := range sigs {
			forward(cfg.PIDNS, shell, s.(syscall.Signal))
		}
	}()
	ws := reap(shell)
	if !cfg.PIDNS {
		killDescendants()
	}
	if ws.Signaled() {
		fmt.Fprintf(status, "signal %d\n", int(ws.Signal()))
		return 128 + int(ws.Signal())
	}
	fmt.Fprintf(status, "exit %d\n", ws.ExitStatus())
	return ws.ExitStatus()
}

// startLimited starts the shell with the call's rlimits. They must bind the
// shell and not the launcher (a Go runtime under a small address-space
// limit cannot create threads), and there is no gap to set them between
// fork and exec in Go: the child starts traced, stops at its exec, gets
// its limits with prlimit, and is let go. Nothing of the command has run
// before the limits are in place.
func startLimited(cfg Config) (int, error) {
	runtime.LockOSThread() // ptrace requests come from the tracing thread
	defer runtime.UnlockOSThread()
	proc, err := os.StartProcess(lookPath(cfg.Argv[0]), cfg.Argv, &os.ProcAttr{
		Dir: cfg.Dir, Env: os.Environ(), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys: &syscall.SysProcAttr{Ptrace: true},
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", cfg.Argv[0], err)
	}
	pid := proc.Pid
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || !ws.Stopped() {
			return 0, fmt.Errorf("shell did not stop at exec: %v (%v)", err, ws)
		}
		break
	}
	if err := cfg.Limits.apply(pid, cfg.Cgroup == "" && os.Geteuid() != 0); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return 0, err
	}
	if err := unix.PtraceDetach(pid); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return 0, fmt.Errorf("release shell: %w", err)
	}
	return pid, nil
}

// forward passes a termination signal on: to every process of the
// namespace (kill -1 from its pid 1), else to the shell.
func forward(pidns bool, shell int, s syscall.Signal) {
	if pidns {
		_ = unix.Kill(-1, s)
		return
	}
	_ = unix.Kill(shell, s)
}

// reap waits for the shell, reaping every orphan handed to us meanwhile.
func reap(shell int) unix.WaitStatus {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ws
		}
		if pid == shell {
			return ws
		}
	}
}

// killDescendants is the subreaper fallback: kill every child (orphans were
// reparented to us) until none is left.
func killDescendants() {
	for range 1000 {
		kids := children()
		if len(kids) == 0 {
			return
		}
		for _, pid := range kids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		for {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); err != nil {
				break
			}
			if len(children()) == 0 {
				break
			}
		}
	}
}

func children() []int {
	tasks, _ := os.ReadDir("/proc/self/task")
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

func lookPath(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return name
}

// dropCaps removes from the bounding set every capability that could undo
// the confinement (mount, ptrace, raise limits, raw network, modules), so
// the shell exec'd next never holds them, even as root.
func dropCaps() error {
	for _, c := range droppedCaps {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	return nil
}

var droppedCaps = []int{
	unix.CAP_SYS_ADMIN, unix.CAP_SYS_PTRACE, unix.CAP_SYS_RESOURCE, unix.CAP_SYS_MODULE, unix.CAP_SYS_RAWIO,
	unix.CAP_NET_ADMIN, unix.CAP_NET_RAW, unix.CAP_MKNOD, unix.CAP_SYS_BOOT, unix.CAP_SYS_TIME,
	unix.CAP_MAC_ADMIN, unix.CAP_MAC_OVERRIDE, unix.CAP_BPF, unix.CAP_PERFMON, unix.CAP_SETPCAP,
	unix.CAP_SETFCAP, unix.CAP_SYS_CHROOT, unix.CAP_LINUX_IMMUTABLE, unix.CAP_SYSLOG, unix.CAP_AUDIT_CONTROL,
	unix.CAP_SYS_PACCT, unix.CAP_SYS_TTY_CONFIG, unix.CAP_SYS_NICE, unix.CAP_IPC_OWNER, unix.CAP_CHECKPOINT_RESTORE,
	unix.CAP_WAKE_ALARM, unix.CAP_BLOCK_SUSPEND, unix.CAP_LEASE,
}

// restrict applies the Landlock domain: read everything but the hidden
// roots (minus Read and Write), write only Write and the sinks, no TCP when
// the network is off, no signals or abstract sockets out of the domain.
func restrict(cfg Config) error {
	ll := landlock.V11.BestEffort()
	if cfg.Network {
		ll.HandledAccessNet = 0
	}
	rules, err := readRules(cfg.Hidden)
	if err != nil {
		return err
	}
	if len(cfg.Read) > 0 {
		rules = append(rules, landlock.RODirs(cfg.Read...))
	}
	if len(cfg.Write) > 0 {
		rules = append(rules, landlock.RWDirs(cfg.Write...).WithRefer())
	}
	rules = append(rules, landlock.RWFiles(sinks...).IgnoreIfMissing())
	return ll.Restrict(rules...)
}

// sinks are the devices every mode may write.
var sinks = []string{"/dev/null", "/dev/zero", "/dev/full"}
