package bash

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox"
	"github.com/dsh-dev/dsh/services/toolhost/internal/spill"
)

// Defaults of the local executor (the original's).
const (
	DefaultTimeout   = 2 * time.Minute
	MaxTimeout       = 10 * time.Minute
	DefaultGrace     = 3 * time.Second
	DefaultMaxOutput = 64000
	DefaultMaxSpill  = 1 << 30
	// DefaultMaxLive caps the live output streamed to the caller per stream.
	DefaultMaxLive = 1 << 20
)

// Executor runs commands as fresh non-login `bash -c` processes, each the
// leader of its own process group, with stdin from /dev/null.
//
// # Shutdown
//
// Killing a process sends SIGTERM to its whole group, then SIGKILL to the
// group after Grace (or as soon as the leader exited), so grandchildren that
// ignore SIGTERM die too. After the leader exits, the output pipes get Grace
// to drain before they are closed.
type Executor struct {
	// Spill stores full outputs that pass MaxOutput; nil disables spilling.
	Spill *spill.Dir
	// Env is the base environment of unconfined spawns (an allow-list, see
	// sandbox.Environ); a Sandbox builds its own from the same list.
	Env []string
	// Sandbox confines every spawn (launcher, namespaces, Landlock,
	// limits); nil spawns bash directly (tests and benchmarks only).
	Sandbox *sandbox.Sandbox
	// Limits are the sandbox's limits, named in the limit markers.
	Limits sandbox.Limits
	// Grace is the TERM→KILL and pipe-drain grace; zero means 3 s.
	Grace time.Duration
	// MaxOutput caps each stream kept in memory; zero means 64000 bytes.
	MaxOutput int
	// MaxSpill caps each spill file; zero means 1 GiB.
	MaxSpill int64
	// MaxLive caps the live output of each stream; zero means 1 MiB.
	MaxLive int64
}

// Spec is one command run.
type Spec struct {
	Command string
	// Dir is the absolute working directory.
	Dir string
	// Env is appended to the executor's environment.
	Env []string
	// SessionID and CallID name the spill files.
	SessionID, CallID string
	// OnOutput receives live output ("stdout" / "stderr"); may be nil.
	OnOutput func(stream, text string)
	// Policy, Root and SpillDir confine the run when the executor has a
	// Sandbox: the mode and network, the session's real workspace root,
	// and its own spill directory (readable).
	Policy         sandbox.Policy
	Root, SpillDir string
}

// Exit is how a process ended.
type Exit struct {
	// Code is the exit status when the process exited; nil when a signal
	// ended it.
	Code *int
	// Signal names the signal that ended it (SIGKILL), if one did.
	Signal string
}

// Process is a started command.
type Process struct {
	cmd            *exec.Cmd
	pgid           int
	stdout, stderr *capture
	grace          time.Duration
	done           chan struct{}
	exit           Exit
	killOnce       sync.Once
	killed         chan struct{}
	run            *sandbox.Run
}

// Confinement is how the process was confined: the enforcement and the
// containment ("" for an unconfined spawn).
func (p *Process) Confinement() (toolsv1.SandboxEnforcement, string) {
	if p.run == nil {
		return toolsv1.SandboxEnforcement_SANDBOX_ENFORCEMENT_UNSPECIFIED, ""
	}
	return p.run.Enforcement, p.run.Containment
}

// ErrStart is the spawn failure class (bad workdir, missing shell).
var ErrStart = errors.New("start command")

// Start spawns a command with no time limit.
func (x *Executor) Start(spec Spec) (*Process, error) {
	grace := x.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	maxOut := x.MaxOutput
	if maxOut <= 0 {
		maxOut = DefaultMaxOutput
	}
	maxSpill := x.MaxSpill
	if maxSpill <= 0 {
		maxSpill = DefaultMaxSpill
	}
	fi, err := os.Stat(spec.Dir)
	if err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: working directory %s does not exist or is not a directory", ErrStart, spec.Dir)
	}
	newCapture := func(stream string) *capture {
		maxLive := x.MaxLive
		if maxLive <= 0 {
			maxLive = DefaultMaxLive
		}
		c := &capture{max: maxOut, maxSpill: maxSpill, maxLive: maxLive}
		if x.Spill != nil {
			c.newSpill = func() (*os.File, error) { return x.Spill.Create(spec.SessionID, spec.CallID+"-"+stream+".log") }
		}
		if spec.OnOutput != nil {
			c.onData = func(s string) { spec.OnOutput(stream, s) }
		}
		return c
	}
	p := &Process{stdout: newCapture("stdout"), stderr: newCapture("stderr"), grace: grace, done: make(chan struct{}), killed: make(chan struct{})}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStart, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("%w: %v", ErrStart, err)
	}
	var cmd *exec.Cmd
	if x.Sandbox != nil {
		p.run, err = x.Sandbox.Command(sandbox.Call{
			Policy: spec.Policy, Root: spec.Root, SpillDir: spec.SpillDir,
			Command: spec.Command, Dir: spec.Dir, Env: spec.Env,
		})
		if err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return nil, err
		}
		cmd = p.run.Cmd
	} else {
		cmd = exec.Command("bash", "-c", spec.Command)
		cmd.Dir = spec.Dir
		cmd.Env = append(append([]string{}, x.Env...), spec.Env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err == nil && p.run != nil {
		if err = p.run.Started(); err != nil {
			// The launcher reported its setup failure and exits by itself.
			_ = cmd.Wait()
			p.run.Finish()
			outR.Close()
			errR.Close()
			return nil, err
		}
	}
	if err != nil {
		if p.run != nil {
			p.run.Finish()
		}
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("%w: %v", ErrStart, err)
	}
	p.cmd, p.pgid = cmd, cmd.Process.Pid
	var drained sync.WaitGroup
	drained.Go(func() { io.Copy(p.stdout, outR) })
	drained.Go(func() { io.Copy(p.stderr, errR) })
	go func() {
		err := cmd.Wait()
		p.exit = exitOf(cmd.ProcessState, err)
		if p.run != nil {
			// Every process of the call is gone once the launcher is.
			p.run.Finish()
			if code, sig, ok := p.run.Result(); ok {
				p.exit = Exit{Code: &code}
				if sig != 0 {
					p.exit = Exit{Signal: unix.SignalName(sig)}
				}
			}
		}
		pipes := make(chan struct{})
		go func() { drained.Wait(); close(pipes) }()
		select {
		case <-pipes:
		case <-time.After(grace):
			// Something the command started still holds the pipes.
			outR.Close()
			errR.Close()
			<-pipes
		}
		outR.Close()
		errR.Close()
		p.stdout.finish()
		p.stderr.finish()
		close(p.done)
	}()
	return p, nil
}

func exitOf(st *os.ProcessState, err error) Exit {
	if st == nil {
		return Exit{Signal: "unknown"}
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return Exit{Signal: unix.SignalName(ws.Signal())}
	}
	c := st.ExitCode()
	return Exit{Code: &c}
}

// Done is closed when the process exited and its output drained.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exit is how the process ended; valid after Done.
func (p *Process) Exit() Exit { return p.exit }

// Pgid is the process group id.
func (p *Process) Pgid() int { return p.pgid }

// Kill terminates the whole process group (TERM, then KILL after the grace
// or once the leader is gone). It returns false when the process had
// already finished; it is idempotent and does not wait.
func (p *Process) Kill() bool {
	select {
	case <-p.done:
		return false
	default:
	}
	p.killOnce.Do(func() {
		close(p.killed)
		_ = syscall.Kill(-p.pgid, syscall.SIGTERM)
		go func() {
			select {
			case <-p.done:
			case <-time.After(p.grace):
			}
			_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		}()
	})
	return true
}

// KillWait kills the group and waits until the process finished.
func (p *Process) KillWait() {
	p.Kill()
	<-p.done
	// The leader is gone; make sure no member of its group outlives it.
	_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
}

// Stdout and Stderr are the collected streams so far.
func (p *Process) Stdout() Output { return p.stdout.output() }

// Stderr is the collected stderr so far.
func (p *Process) Stderr() Output { return p.stderr.output() }

// RunResult is a finished foreground run.
type RunResult struct {
	Exit
	// TimedOut and Aborted say why the run was killed; the first cause wins
	// and they are mutually exclusive.
	TimedOut, Aborted bool
	// Timeout is the effective time limit.
	Timeout        time.Duration
	Stdout, Stderr Output
	// Enforcement and Containment say how the run was confined
	// (Containment is empty for an unconfined spawn).
	Enforcement toolsv1.SandboxEnforcement
	Containment string
}

// Run runs a command to completion or until timeout or ctx ends, killing its
// process group then. It fails only when the command cannot start.
func (x *Executor) Run(ctx context.Context, spec Spec, timeout time.Duration) (RunResult, error) {
	if err := ctx.Err(); err != nil {
		return RunResult{}, err
	}
	p, err := x.Start(spec)
	if err != nil {
		return RunResult{}, err
	}
	res := RunResult{Timeout: timeout}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		res.TimedOut = true
		p.KillWait()
	case <-ctx.Done():
		res.Aborted = true
		p.KillWait()
	}
	res.Exit = p.exit
	res.Stdout, res.Stderr = p.Stdout(), p.Stderr()
	res.Enforcement, res.Containment = p.Confinement()
	return res, nil
}

func (x *Executor) maxSpill() int64 {
	if x.MaxSpill > 0 {
		return x.MaxSpill
	}
	return DefaultMaxSpill
}
