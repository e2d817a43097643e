// Package launcher is the confined-call launcher the sandbox package
// re-executes: the toolhost binary (or the small dsh-sandbox-launcher)
// started with argv[0] = Arg0 and its Config encoded in the rest of argv
// (see Config.Args). It sits in its own package with few dependencies
// because its init runs before the rest of the binary initialises: only the
// packages it imports are initialised first, so each call pays for a Go
// runtime start, not for the toolhost's proto registries and gRPC.
//
// The Landlock ruleset is not built here: the toolhost builds it (from a
// listing of the filesystem it keeps while unchanged) and hands it over as
// file descriptor RulesetFD; the launcher adds its own /proc, enforces it
// on every one of its threads (the shell inherits it from the one that
// forks it), and closes it.
package launcher

// Keep the imports few and free of path/filepath, encoding/json and the
// Landlock rule builder: Go initialises packages in import-path order as
// their dependencies become ready, and one import that sorts late
// (path/filepath did) lets the proto registries initialise first; every
// package initialised costs each call page faults and CPU.

import (
	"errors"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// Arg0 is the argv[0] marker that turns the toolhost binary into the
// launcher; argv[1] is the protocol marker (see Config.Args).
const Arg0 = "dsh-sandbox-launcher"

// statusFD is the launcher's report pipe to the toolhost: one "ok" or
// "error: <msg>" line once set up, then "exit N" or "signal N".
const statusFD = 3

// RulesetFD is the Landlock ruleset the launcher enforces when
// Config.Landlock is set.
const RulesetFD = 4

// setupFailed is the launcher's exit code when it could not confine itself.
const setupFailed = 125

// The launcher runs before the rest of the binary initialises: this init
// (the package is imported by every binary that embeds the toolhost) sees
// the marker and never returns. Deliberately an init rather than a hook in
// main: main runs only after every package's init.
func init() {
	if len(os.Args) >= 3 && os.Args[0] == Arg0 && os.Args[1] == protocol {
		os.Exit(launch(os.Args[2:]))
	}
}

// Config is what the toolhost tells the launcher; nothing in it is secret
// (the tool can read it from /proc/1/cmdline).
type Config struct {
	// Landlock says the ruleset at RulesetFD is enforced before the shell
	// starts.
	Landlock bool
	Argv     []string
	Dir      string
	// Cgroup is a cgroup directory to join before anything runs.
	Cgroup string
	// PIDNS says the launcher is pid 1 of its own PID and mount namespace.
	PIDNS    bool
	DropCaps bool
	Limits   Limits
}

func launch(args []string) int {
	// Every step below runs on this thread, and the shell is forked from
	// it: the Landlock domain and no_new_privs are per thread, and the
	// shell inherits the forking thread's.
	runtime.LockOSThread()
	status := os.NewFile(statusFD, "status")
	report := func(line string) { _, _ = status.WriteString(line + "\n") }
	fail := func(what string, err error) int {
		msg := what
		if err != nil {
			msg += ": " + err.Error()
		}
		report("error: " + msg)
		return setupFailed
	}
	// No descriptor the toolhost handed over may reach the shell:
	// close-on-exec first, the ruleset closed once enforced.
	for _, fd := range []int{statusFD, RulesetFD} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && (fd == statusFD || err != unix.EBADF) {
			return fail("descriptor "+strconv.Itoa(fd), err)
		}
	}
	cfg, err := ParseArgs(args)
	if err != nil {
		return fail("config", err)
	}
	if cfg.Cgroup != "" {
		if err := os.WriteFile(cfg.Cgroup+"/cgroup.procs", []byte("0"), 0); err != nil {
			return fail("join cgroup "+cfg.Cgroup, err)
		}
	}
	if cfg.PIDNS {
		// Our own /proc: it lists only this call's processes, so no
		// ancestor's environ or memory is even addressable.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fail("make mounts private", err)
		}
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fail("mount /proc", err)
		}
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail("subreaper", err)
	}
	if cfg.DropCaps {
		if err := dropCaps(); err != nil {
			return fail("drop capabilities", err)
		}
	}
	if err := clearInheritable(); err != nil {
		return fail("capabilities", err)
	}
	if cfg.Landlock {
		if err := restrict(cfg.PIDNS); err != nil {
			return fail("landlock", err)
		}
	}
	// Nor any descriptor the launcher inherited without close-on-exec:
	// the shell gets the standard three only.
	if err := cloexecAll(); err != nil {
		return fail("descriptors", err)
	}
	// Not dumpable from here on: a shell of the same uid and Landlock
	// domain (a non-root host) may neither open the launcher's
	// descriptors through /proc (the report pipe, to forge an end) nor
	// ptrace it or read its memory. The exec makes the shell dumpable
	// again; the launcher's own /proc reads (its children) still work.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fail("not dumpable", err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	shell, err := startLimited(cfg)
	if err != nil {
		return fail("start", err)
	}
	report("ok")
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
		report("signal " + strconv.Itoa(int(ws.Signal())))
		return 128 + int(ws.Signal())
	}
	report("exit " + strconv.Itoa(ws.ExitStatus()))
	return ws.ExitStatus()
}

// cloexecAll marks every descriptor above 2 close-on-exec: close_range,
// else (EINVAL on 5.10, ENOSYS before 5.9: CLOSE_RANGE_CLOEXEC needs 5.11)
// the walk of /proc/self/fd.
func cloexecAll() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == unix.EINVAL || err == unix.ENOSYS {
		return cloexecWalk()
	}
	return err
}

// cloexecWalk sets close-on-exec on every descriptor above 2 listed in
// /proc/self/fd (the listing's own, closed by then, is EBADF).
func cloexecWalk() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
			return err
		}
	}
	return nil
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
		return 0, err
	}
	pid := proc.Pid
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, errors.New("shell did not stop at exec: " + err.Error())
		}
		if !ws.Stopped() {
			return 0, errors.New("shell did not stop at exec")
		}
		break
	}
	if err := cfg.Limits.apply(pid, cfg.Cgroup == "" && os.Geteuid() != 0); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return 0, err
	}
	if err := unix.PtraceDetach(pid); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return 0, errors.New("release shell: " + err.Error())
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
			return errors.New("capability " + strconv.Itoa(c) + ": " + err.Error())
		}
	}
	return nil
}

// clearInheritable empties the ambient and inheritable sets of every
// thread, whoever the host is: exec gives root's shell inheritable ∪
// bounding and anyone else's the ambient set, so a capability the host was
// started with (setpriv --inh-caps, ambient capabilities) would otherwise
// survive dropCaps. Lowering them needs no privilege; any failure fails
// the call closed (EINVAL from a kernel without ambient capabilities
// excepted: there is no ambient set to clear).
func clearInheritable() error {
	if err := llsys.AllThreadsPrctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return errors.New("ambient: " + err.Error())
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return errors.New("inheritable: " + err.Error())
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if _, _, e := psx.Syscall3(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return errors.New("inheritable: " + e.Error())
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

// restrict enforces the toolhost's ruleset on every thread and closes it.
// With a PID namespace the launcher mounted a /proc of its own, which the
// toolhost could not name: it is readable (as the host's /proc would be),
// so it gets its rule here. no_new_privs first: landlock_restrict_self
// requires it (or CAP_SYS_ADMIN, which the shell must not keep anyway).
func restrict(ownProc bool) error {
	if ownProc {
		if err := allowRead(RulesetFD, "/proc"); err != nil {
			return errors.New("rule for /proc: " + err.Error())
		}
	}
	// Every thread of the launcher, not only the one that forks the shell:
	// the shell shares the forking thread's domain, so it may ptrace a
	// thread of its parent that has the same domain, and every thread
	// shares the launcher's memory — an unconfined runtime thread (sysmon,
	// a GC worker) would run whatever the shell wrote there with the host's
	// access (TestEveryLauncherThreadIsConfined).
	if err := llsys.AllThreadsPrctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return errors.New("no_new_privs: " + err.Error())
	}
	if err := llsys.AllThreadsLandlockRestrictSelf(RulesetFD, 0); err != nil {
		return errors.New("enforce: " + err.Error())
	}
	return unix.Close(RulesetFD)
}

// readAccess is Landlock's read-only access to a directory tree: execute,
// read files, list directories (the toolhost's read rules grant the same).
const readAccess = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR

// allowRead adds a read-only rule for dir to the ruleset.
func allowRead(ruleset int, dir string) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	attr := unix.LandlockPathBeneathAttr{Allowed_access: readAccess, Parent_fd: int32(fd)}
	if _, _, e := unix.RawSyscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(ruleset), unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&attr)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}
