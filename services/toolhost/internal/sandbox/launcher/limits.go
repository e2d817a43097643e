package launcher

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Limits are the per-call resource limits (rlimits in the launcher, the
// process count also as a pids cgroup when one is usable: RLIMIT_NPROC
// does not bind root). Zero fields take the defaults.
type Limits struct {
	// CPUSeconds is the CPU time of each process (SIGXCPU, then SIGKILL).
	CPUSeconds uint64 `json:"cpu_seconds,omitempty"`
	// MemoryBytes is the address space of each process.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	// Processes is the number of processes and threads of the call.
	Processes uint64 `json:"processes,omitempty"`
	// FileBytes is the largest file a process may write (SIGXFSZ).
	FileBytes uint64 `json:"file_bytes,omitempty"`
}

// The default limits: generous for builds and test runs, fatal for floods.
const (
	DefaultCPUSeconds  = 600
	DefaultMemoryBytes = 8 << 30
	DefaultProcesses   = 1024
	DefaultFileBytes   = 4 << 30
)

// WithDefaults fills zero fields.
func (l Limits) WithDefaults() Limits {
	if l.CPUSeconds == 0 {
		l.CPUSeconds = DefaultCPUSeconds
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	if l.Processes == 0 {
		l.Processes = DefaultProcesses
	}
	if l.FileBytes == 0 {
		l.FileBytes = DefaultFileBytes
	}
	return l
}

// apply sets the rlimits of process pid; nproc says RLIMIT_NPROC may stand in for a
// missing pids cgroup (it counts every process of the uid machine-wide,
// so it is only set when nothing better exists).
func (l Limits) apply(pid int, nproc bool) error {
	set := func(res int, name string, v uint64) error {
		if v == 0 {
			return nil
		}
		if err := unix.Prlimit(pid, res, &unix.Rlimit{Cur: v, Max: v}, nil); err != nil {
			return errors.New("set " + name + " limit: " + err.Error())
		}
		return nil
	}
	// CPU: SIGXCPU at the soft limit (a message the model can read), then
	// SIGKILL a second later should the process ignore it.
	if l.CPUSeconds > 0 {
		if err := unix.Prlimit(pid, unix.RLIMIT_CPU, &unix.Rlimit{Cur: l.CPUSeconds, Max: l.CPUSeconds + 1}, nil); err != nil {
			return errors.New("set cpu limit: " + err.Error())
		}
	}
	if err := set(unix.RLIMIT_AS, "memory", l.MemoryBytes); err != nil {
		return err
	}
	if nproc {
		if err := set(unix.RLIMIT_NPROC, "process", l.Processes); err != nil {
			return err
		}
	}
	if err := set(unix.RLIMIT_FSIZE, "file size", l.FileBytes); err != nil {
		return err
	}
	return unix.Prlimit(pid, unix.RLIMIT_CORE, &unix.Rlimit{}, nil)
}
