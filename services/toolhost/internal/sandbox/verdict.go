package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The probe's verdict is cached per boot so that a host's start does not
// wait for a launcher start, namespaces, Landlock and `bash -c true` (35–45
// ms, on the path of an agent's first ListTools) when nothing it depends on
// has changed since the last probe.
//
// Only the best verdict is cached: Landlock, PID/mount namespaces and
// network namespaces all worked. A cached verdict can therefore never make
// a call weaker than the probe would; it can only be wrong by claiming too
// much, and then the call fails closed, because every call's launcher
// reports its own set-up (Run.Started) and a call is refused unless it says
// "ok". Such a failure also removes the cache, so the next start probes.
//
// The verdict is keyed by everything it depends on: the kernel's boot id
// (a reboot, a new kernel, changed boot parameters), the kernel release,
// the launcher binary and this binary (device, inode, size, modification
// and change times: a new build is a new file), the effective uid (root
// drops capabilities), the Landlock ABI, the pids cgroup version and the
// limits. A verdict with any other key is ignored and replaced. The file is
// read only when it is a regular file (not a symlink) owned by this uid
// with no group or other permission bits, in a directory owned by this uid
// that no one else may write — checked on an open descriptor of the
// directory, through which the file is then read, written and removed.

// verdictVersion changes whenever the probe or this format does.
const verdictVersion = 1

// VerdictFile is the cache's name inside Config.VerdictDir.
const VerdictFile = "sandbox-verdict.json"

// maxVerdictBytes bounds what is read of a cache file.
const maxVerdictBytes = 4096

// fileID identifies one build of a binary.
type fileID struct {
	Dev, Ino, Size, Mtime, Ctime int64
}

func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{Dev: int64(st.Dev), Ino: int64(st.Ino), Size: st.Size, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}, nil
}

// verdictKey is what a verdict depends on.
type verdictKey struct {
	Version     int
	BootID      string
	Kernel      string
	Launcher    fileID
	Self        fileID
	EUID        int
	LandlockABI int
	PidsCgroup  string
	Limits      Limits
}

// verdict is the cache file's content: the key and what the probe found.
type verdict struct {
	Key          verdictKey
	Namespaces   bool
	NetNamespace bool
}

// currentKey is the key of this host's probe as the machine stands now.
func (s *Sandbox) currentKey() (verdictKey, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return verdictKey{}, fmt.Errorf("boot id: %w", err)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return verdictKey{}, fmt.Errorf("uname: %w", err)
	}
	k := verdictKey{Version: verdictVersion, BootID: strings.TrimSpace(string(boot)),
		Kernel: unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:]),
		EUID:   os.Geteuid(), LandlockABI: s.support.LandlockABI, PidsCgroup: s.support.PidsCgroup, Limits: s.cfg.Limits}
	if k.BootID == "" {
		return verdictKey{}, errors.New("boot id: empty")
	}
	if k.Launcher, err = statID(s.cfg.Exe); err != nil {
		return verdictKey{}, fmt.Errorf("launcher: %w", err)
	}
	if k.Self, err = statID("/proc/self/exe"); err != nil {
		return verdictKey{}, fmt.Errorf("this binary: %w", err)
	}
	return k, nil
}

// cachedVerdict returns the cached verdict when it holds for key; any
// doubt (missing, another key, unsafe file or directory, bad content) is
// "no verdict".
func (s *Sandbox) cachedVerdict(key verdictKey) (verdict, bool) {
	if s.cfg.VerdictDir == "" {
		return verdict{}, false
	}
	dir, err := openPrivateDir(s.cfg.VerdictDir)
	if err != nil {
		return verdict{}, false
	}
	defer unix.Close(dir)
	fd, err := unix.Openat(dir, VerdictFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return verdict{}, false
	}
	f := os.NewFile(uintptr(fd), VerdictFile)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return verdict{}, false
	}
	b, err := io.ReadAll(io.LimitReader(f, maxVerdictBytes+1))
	if err != nil || len(b) > maxVerdictBytes {
		return verdict{}, false
	}
	var v verdict
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil || v.Key != key || !v.Namespaces || !v.NetNamespace {
		return verdict{}, false
	}
	return v, true
}

// openPrivateDir opens dir (not following a symlink at its last
// component) and checks on the open descriptor that it is a directory
// owned by this uid that no one else may write. Every later step works on
// that descriptor (openat, renameat, unlinkat), so a directory swapped for
// another (or for a symlink) after the check is never written through: the
// runtime directory may belong to someone else (`sudo -E` keeps a user's
// XDG_RUNTIME_DIR).
func openPrivateDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a private directory (owned by uid %d, not group or world writable)", dir, os.Geteuid())
	}
	return fd, nil
}

// storeVerdict caches the probe's verdict when it is the best one, and
// removes any cached verdict otherwise. The file is written whole and
// renamed into place (0600), so a concurrent start reads the old or the
// new verdict, never half of one.
func (s *Sandbox) storeVerdict(key verdictKey) error {
	sp := s.support
	if sp.Unavailable != nil || !sp.Namespaces || !sp.NetNamespace {
		s.forgetVerdict()
		return nil
	}
	if err := os.MkdirAll(s.cfg.VerdictDir, 0o700); err != nil {
		return err
	}
	dir, err := openPrivateDir(s.cfg.VerdictDir)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	b, err := json.Marshal(verdict{Key: key, Namespaces: true, NetNamespace: true})
	if err != nil {
		return err
	}
	var tmp string
	fd := -1
	for i := 0; fd < 0; i++ {
		tmp = fmt.Sprintf("%s.%d.%d", VerdictFile, os.Getpid(), i)
		fd, err = unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil && (!errors.Is(err, unix.EEXIST) || i >= 100) {
			return fmt.Errorf("%s: %w", filepath.Join(s.cfg.VerdictDir, tmp), err)
		}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(b)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dir, tmp, dir, VerdictFile)
	}
	if werr != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
	}
	return werr
}

// forgetVerdict removes the cached verdict (a call's set-up failed, or the
// probe found less than the best): the next start probes. Only from a
// private directory, through its descriptor.
func (s *Sandbox) forgetVerdict() {
	if s.cfg.VerdictDir == "" {
		return
	}
	dir, err := openPrivateDir(s.cfg.VerdictDir)
	if err != nil {
		return
	}
	defer unix.Close(dir)
	_ = unix.Unlinkat(dir, VerdictFile, 0)
}

// VerdictDir is where a host keeps its probe verdict: $XDG_RUNTIME_DIR/dsh
// (a per-user, per-boot tmpfs) when it is set, else fallback (empty: no
// cache).
func VerdictDir(getenv func(string) string, fallback string) string {
	if d := getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "dsh")
	}
	return fallback
}
