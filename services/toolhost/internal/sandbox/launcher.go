package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Config configures a host's sandbox.
type Config struct {
	// HostRoot is the host's --workspace: every session's root lies under
	// it, and its contents are hidden from a call except its own root.
	HostRoot string
	// SpillRoot is the host's spill directory (hidden except the call's
	// own session directory, which is readable).
	SpillRoot string
	// Limits are the per-call resource limits (defaults filled).
	Limits Limits
	// Environ is the host environment the allow-list picks from; nil means
	// os.Environ().
	Environ []string
	// ToolEnv names extra host variables passed through to tools.
	ToolEnv []string
	// Exe is the launcher binary; empty means DefaultExe: the small
	// dsh-sandbox-launcher next to this binary when there is one, else
	// /proc/self/exe (this binary, whose init hook serves the launcher).
	Exe string
	// Logger receives the startup report.
	Logger *slog.Logger
	// VerdictDir, when set, keeps the probe's verdict for this boot (see
	// verdict.go): a later start with the same kernel, binaries and
	// settings takes it instead of probing. Empty: probe at every start.
	VerdictDir string
}

// DefaultExe is the launcher a Sandbox runs when Config.Exe is empty: the
// small dsh-sandbox-launcher binary (services/toolhost/cmd/dsh-sandbox-launcher)
// when it lies next to this process's executable, because a Go runtime
// starts faster from a small binary and every bash call pays that start;
// else /proc/self/exe, this binary re-executed, whose launcher init hook
// serves the call just the same. The sibling is as trusted as the binary
// beside it (whoever can replace one can replace the other); both come from
// the same build (make build, the Dockerfile).
func DefaultExe() string {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), launcher.Arg0)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return "/proc/self/exe"
}

// Support is what this machine offers, probed once per Sandbox (in the
// background from New; every reader waits for the probe).
type Support struct {
	// LandlockABI is the kernel's Landlock ABI (0: none).
	LandlockABI int
	// Namespaces says each call gets its own PID and mount namespace.
	Namespaces bool
	// NetNamespace says network-off calls get an empty network namespace.
	NetNamespace bool
	// PidsCgroup is "v2", "v1" or "" (RLIMIT_NPROC only).
	PidsCgroup string
	// Unavailable says why confined modes cannot run (nil: they can).
	Unavailable error
	// Cached says the verdict is this boot's cached one (no probe ran).
	Cached bool
}

// Containment names how leftover processes are killed.
func (s Support) Containment() string {
	if s.Namespaces {
		return "pid-namespace"
	}
	return "subreaper"
}

// Sandbox builds confined commands for one host.
type Sandbox struct {
	cfg     Config
	hidden  []string
	tmpRoot string
	support Support
	pids    *pidsCgroups
	outside *readListing
	pool    *rulesetPool
	// probed is closed when the probe has filled support; everything that
	// reads support waits for it, so a confined call can never be prepared
	// on a guess (fail closed).
	probed chan struct{}
	// reaping waits for the probe's processes.
	reaping sync.WaitGroup
}

// New prepares the host's temporary area and starts probing the machine in
// the background: running the launcher costs a process start (a Go runtime,
// and bash), which stays off a host's start-up path; Support, Enforcement
// and Command wait for the probe. With Config.VerdictDir, a verdict cached
// by an earlier start of this boot with the same binaries and settings is
// taken instead, and no probe runs (verdict.go). New fails only on setup
// errors; a machine that cannot confine is reported in Support (and logged
// as a WARN), and confined calls then fail closed.
func New(cfg Config) (*Sandbox, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Environ == nil {
		cfg.Environ = os.Environ()
	}
	if cfg.Exe == "" {
		cfg.Exe = DefaultExe()
	}
	cfg.Limits = cfg.Limits.WithDefaults()
	s := &Sandbox{cfg: cfg, probed: make(chan struct{})}
	tmp, err := os.MkdirTemp("", "dsh-toolhost-tmp-")
	if err != nil {
		return nil, fmt.Errorf("sandbox temp area: %w", err)
	}
	// The temporary area's real path: a call's directory in it is opened
	// with no symbolic link in its path (openRuleDir).
	if rp, err := filepath.EvalSymlinks(tmp); err == nil {
		tmp = rp
	}
	s.tmpRoot = tmp
	for _, p := range []string{cfg.HostRoot, cfg.SpillRoot, tmp} {
		if p == "" {
			continue
		}
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			s.hidden = append(s.hidden, rp)
		}
	}
	s.outside = &readListing{hidden: s.hidden}
	s.pool = newRulesetPool(tmp)
	s.support.LandlockABI, _ = llsys.LandlockGetABIVersion()
	// The temporary area's random suffix tells this host's cgroups apart.
	if pc, err := newPidsCgroups(strings.TrimPrefix(filepath.Base(tmp), "dsh-toolhost-tmp-")); err == nil {
		s.pids = pc
		s.support.PidsCgroup = "v" + strconv.Itoa(pc.version)
	} else {
		cfg.Logger.Info("sandbox: no pids cgroup; the process limit is RLIMIT_NPROC only (root ignores it)", "why", err)
	}
	var key verdictKey
	if cfg.VerdictDir != "" {
		if key, err = s.currentKey(); err != nil {
			cfg.Logger.Debug("sandbox: no verdict cache", "why", err)
			s.cfg.VerdictDir = ""
		} else if v, ok := s.cachedVerdict(key); ok && s.support.LandlockABI >= 1 {
			s.support.Namespaces, s.support.NetNamespace, s.support.Cached = v.Namespaces, v.NetNamespace, true
			close(s.probed)
			s.report()
			return s, nil
		}
	}
	go func() {
		s.probe()
		// Stored before any call can run, so a call whose set-up fails
		// (and drops the verdict) comes after it.
		var serr error
		if s.cfg.VerdictDir != "" {
			serr = s.storeVerdict(key)
		}
		close(s.probed)
		s.report()
		if serr != nil {
			s.cfg.Logger.Info("sandbox: cannot cache the probe's verdict; the next start probes again", "why", serr)
		}
	}()
	return s, nil
}

// probe runs the launcher once with each backend, best first.
func (s *Sandbox) probe() {
	try := func(ns, net bool) error {
		s.support.Namespaces, s.support.NetNamespace = ns, net
		return s.run("true", Policy{Mode: ReadOnly, Network: !net})
	}
	if s.support.LandlockABI < 1 {
		s.support.Unavailable = errors.New("the kernel offers no Landlock (CONFIG_SECURITY_LANDLOCK, lsm=landlock)")
	}
	switch {
	case try(true, true) == nil:
	case try(true, false) == nil:
	default:
		err := try(false, false)
		if err != nil && s.support.Unavailable == nil {
			s.support.Unavailable = err
		}
	}
}

// run starts a probe command and returns its setup report.
func (s *Sandbox) run(command string, p Policy) error {
	dir := s.tmpRoot
	r, err := s.command(Call{Policy: p, Root: dir, Dir: dir, Command: command})
	if err != nil {
		return err
	}
	if err := r.Cmd.Start(); err != nil {
		r.abandon()
		return fmt.Errorf("%w: start launcher: %v", ErrUnavailable, err)
	}
	err = r.Started()
	// The verdict is the launcher's setup report; the probe's bash is
	// reaped (and its temporary directory and cgroup removed) off the
	// path, before Close.
	s.reaping.Go(func() {
		_ = r.Cmd.Wait()
		r.Finish()
	})
	return err
}

func (s *Sandbox) report() {
	sp := s.support
	attrs := []any{"launcher", s.cfg.Exe, "cached", sp.Cached, "landlock_abi", sp.LandlockABI, "containment", sp.Containment(), "netns", sp.NetNamespace, "pids_cgroup", sp.PidsCgroup,
		"limits", fmt.Sprintf("cpu=%ds mem=%d procs=%d fsize=%d", s.cfg.Limits.CPUSeconds, s.cfg.Limits.MemoryBytes, s.cfg.Limits.Processes, s.cfg.Limits.FileBytes)}
	if sp.Unavailable != nil {
		s.cfg.Logger.Warn("sandbox unavailable: confined calls (read-only, workspace-write) will fail with SANDBOX_UNAVAILABLE", append(attrs, "why", sp.Unavailable)...)
		return
	}
	s.cfg.Logger.Info("sandbox ready", attrs...)
}

// Limits are the per-call limits in force.
func (s *Sandbox) Limits() Limits { return s.cfg.Limits }

// Support is what the probe found (it waits for the probe).
func (s *Sandbox) Support() Support {
	<-s.probed
	return s.support
}

// Enforcement is how much of p a call gets.
func (s *Sandbox) Enforcement(p Policy) toolsv1.SandboxEnforcement {
	<-s.probed
	return s.enforcement(p)
}

func (s *Sandbox) enforcement(p Policy) toolsv1.SandboxEnforcement {
	if !p.Mode.Confined() || s.support.Unavailable != nil {
		return toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_UNSPECIFIED
	}
	// ABI 3 governs truncation, ABI 2 cross-directory links and renames;
	// network off is whole only in an empty network namespace (Landlock
	// before ABI 10 governs TCP only).
	if s.support.LandlockABI < 3 || (!p.Network && !s.support.NetNamespace) {
		return toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_PARTIAL
	}
	return toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_FULL
}

// Close removes the temporary area and the cgroups.
func (s *Sandbox) Close() error {
	<-s.probed // the probe uses the temporary area and the cgroups
	s.reaping.Wait()
	s.pool.close()
	s.outside.close()
	if s.pids != nil {
		s.pids.close()
	}
	return os.RemoveAll(s.tmpRoot)
}

// Call is one command to confine.
type Call struct {
	Policy Policy
	// Root is the session's absolute workspace root (symlinks resolved).
	Root string
	// SpillDir is the session's own spill directory, readable by the call.
	SpillDir string
	// Command runs with bash -c in Dir.
	Command, Dir string
	// Env is appended to the allow-listed environment.
	Env []string
}

// Run is a prepared confined command: set Stdout/Stderr, Start it, call
// Started, Wait, then Finish.
type Run struct {
	Cmd         *exec.Cmd
	Enforcement toolsv1.SandboxEnforcement
	// Containment names how leftovers die (pid-namespace, subreaper).
	Containment string

	// ok says the launcher reported its set-up done; a call's Run
	// finished without it calls setupFailed (the cached verdict is dropped).
	ok          bool
	setupFailed func()

	statusR, statusW *os.File
	// ruleset is the Landlock ruleset handed to the launcher (closed once
	// it started); pooled is the ruleset it duplicates, the call's until
	// Finish gives it back to pool.
	ruleset     *os.File
	pooled      *pooledRuleset
	pool        *rulesetPool
	status      *bufio.Reader
	cgroup, tmp string
	result      string
}

// Command prepares a call. A confined policy on a machine that cannot
// enforce it is ErrUnavailable. It waits for the probe.
func (s *Sandbox) Command(c Call) (*Run, error) {
	<-s.probed
	r, err := s.command(c)
	if r != nil {
		r.setupFailed = s.forgetVerdict // a verdict that no longer holds
	}
	return r, err
}

// command prepares a call from support as it stands (the probe's own runs
// use it while support is being filled).
func (s *Sandbox) command(c Call) (*Run, error) {
	if c.Policy.Mode.Confined() && s.support.Unavailable != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, s.support.Unavailable)
	}
	r := &Run{Enforcement: s.enforcement(c.Policy), Containment: s.support.Containment()}
	if c.SpillDir != "" {
		if err := os.MkdirAll(c.SpillDir, 0o700); err != nil {
			c.SpillDir = "" // not readable then, as before: nothing to read
		}
	}
	lc := launcher.Config{
		Landlock: c.Policy.Mode.Confined(),
		Argv:     []string{"bash", "-c", c.Command}, Dir: c.Dir,
		// A non-root host holds no capabilities to drop (and may not touch
		// the bounding set); root drops them or fails closed.
		PIDNS: s.support.Namespaces, DropCaps: os.Geteuid() == 0, Limits: s.cfg.Limits,
	}
	var tmp string
	if lc.Landlock {
		var read, write []string
		if c.SpillDir != "" {
			read = append(read, c.SpillDir)
		}
		if c.Policy.Mode == WorkspaceWrite {
			write = []string{c.Root} // and the ruleset's own directory
		} else {
			read = append(read, c.Root)
		}
		outside, err := s.outside.get()
		if err != nil {
			return nil, fmt.Errorf("%w: landlock: %v", ErrUnavailable, err)
		}
		rs, err := s.pool.take(outside, c.Policy.Mode, c.Policy.Network, read, write)
		s.outside.put(outside)
		if err != nil {
			// A directory of the call's that now is, or passes through, a
			// symbolic link (fileopen.ErrEscapes) fails closed here.
			return nil, fmt.Errorf("%w: landlock: %w", ErrUnavailable, err)
		}
		r.pooled, r.pool, tmp = rs, s.pool, rs.dir
		fd, err := unix.FcntlInt(uintptr(rs.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			r.abandon()
			return nil, fmt.Errorf("%w: landlock: %v", ErrUnavailable, err)
		}
		r.ruleset = os.NewFile(uintptr(fd), "landlock-ruleset")
	} else {
		var err error
		if tmp, err = os.MkdirTemp(s.tmpRoot, "call-"); err != nil {
			return nil, fmt.Errorf("call temp dir: %w", err)
		}
		r.tmp = tmp
	}
	if s.pids != nil {
		cg, err := s.pids.create(s.cfg.Limits.Processes)
		if err != nil {
			r.abandon()
			return nil, fmt.Errorf("%w: call cgroup: %v", ErrUnavailable, err)
		}
		r.cgroup, lc.Cgroup = cg, cg
	}
	var err error
	r.statusR, r.statusW, err = os.Pipe()
	if err != nil {
		r.abandon()
		return nil, err
	}
	attr := &syscall.SysProcAttr{Setpgid: true}
	if s.support.Namespaces {
		attr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
		if !c.Policy.Network && s.support.NetNamespace {
			attr.Cloneflags |= syscall.CLONE_NEWNET
		}
	}
	env := Environ(s.cfg.Environ, s.cfg.ToolEnv, append([]string{"TMPDIR=" + tmp}, c.Env...)...)
	r.Cmd = &exec.Cmd{
		Path: s.cfg.Exe, Args: lc.Args(), Env: env, Dir: c.Dir,
		ExtraFiles: []*os.File{r.statusW}, SysProcAttr: attr,
	}
	if r.ruleset != nil {
		r.Cmd.ExtraFiles = append(r.Cmd.ExtraFiles, r.ruleset)
	}
	return r, nil
}

// Started waits for the launcher's setup report (call it after Start).
// An error means the command never ran.
func (r *Run) Started() error {
	r.statusW.Close()
	r.statusW = nil
	r.closeRuleset()
	r.status = bufio.NewReader(r.statusR)
	line, _ := r.status.ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case line == "ok":
		r.ok = true
		return nil
	case strings.HasPrefix(line, "error: "):
		return fmt.Errorf("%w: %s", ErrUnavailable, strings.TrimPrefix(line, "error: "))
	}
	return fmt.Errorf("%w: the launcher died during setup", ErrUnavailable)
}

// Finish reads the shell's end from the launcher and removes the call's
// temporary directory and cgroup. Call it after Wait returned (every
// process of the call is gone by then).
func (r *Run) Finish() {
	if !r.ok && r.setupFailed != nil {
		r.setupFailed() // Start or the launcher's set-up failed
		r.setupFailed = nil
	}
	if r.status != nil {
		rest, _ := r.status.ReadString('\n')
		r.result = strings.TrimSpace(rest)
	}
	if _, _, done := r.Result(); r.ok && done && r.pooled != nil {
		// The launcher reaped the shell and killed what was left; the
		// call's cgroup going away proves every process of it is gone
		// (without one, the PID namespace or subreaper is the proof).
		// Only then may the ruleset serve the next call with the same
		// additions (pool.go); abandon drops it otherwise.
		r.closeRuleset()
		gone := r.cgroup == "" || remove(r.cgroup)
		r.cgroup = ""
		if gone {
			r.pool.put(r.pooled)
			r.pooled = nil
		}
	}
	r.abandon()
}

// Result is the shell's own end as the launcher saw it: the exit code, or
// the signal that killed it; ok is false when the launcher itself was
// killed first (then the process state speaks).
func (r *Run) Result() (code int, sig syscall.Signal, ok bool) {
	kind, n, found := strings.Cut(r.result, " ")
	v, err := strconv.Atoi(n)
	if !found || err != nil {
		return 0, 0, false
	}
	switch kind {
	case "exit":
		return v, 0, true
	case "signal":
		return 0, syscall.Signal(v), true
	}
	return 0, 0, false
}

func (r *Run) closeRuleset() {
	if r.ruleset != nil {
		r.ruleset.Close()
		r.ruleset = nil
	}
}

func (r *Run) abandon() {
	for _, f := range []*os.File{r.statusR, r.statusW} {
		if f != nil {
			f.Close()
		}
	}
	r.statusR, r.statusW = nil, nil
	r.closeRuleset()
	if r.pooled != nil {
		r.pool.drop(r.pooled)
		r.pooled = nil
	}
	if r.cgroup != "" {
		remove(r.cgroup)
		r.cgroup = ""
	}
	if r.tmp != "" {
		removeAll(r.tmp)
		r.tmp = ""
	}
}
