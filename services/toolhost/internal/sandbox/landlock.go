package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/dsh-dev/dsh/internal/fileopen"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// A confined call's Landlock ruleset is built by the toolhost and handed to
// the launcher as a descriptor (launcher.RulesetFD); the launcher adds the
// one rule only it can name (its own, freshly mounted /proc: a procfs
// instance belongs to the call's PID namespace and does not exist before
// the launcher does), enforces it and closes it before the shell starts.
//
// Spelling "everything but the hidden roots" takes one rule per sibling on
// the way down to each (hundreds on a shared /tmp). The listing of those
// siblings is the host's, not the call's: it is made once and reused while
// every directory it listed is unchanged (readListing), with an O_PATH
// descriptor kept for each sibling (but mount roots), so a call's ruleset
// costs one landlock_add_rule per sibling instead of a directory walk and
// an open, a rule and a close per sibling, the same rules a fresh walk
// would give; and a call's ruleset is reused by the next call with the same
// additions (pool.go), which then adds none.

// listingSettle is how long a listed directory must have been unchanged
// before its listing is reused: file times are coarse (a clock tick), so a
// change in the same tick as the listing may leave the time as it was.
const listingSettle = 50 * time.Millisecond

// stat identifies a directory as it was: which one, and when it last changed.
type stat struct {
	dev, ino     uint64
	mtime, ctime int64
}

func stamp(path string) (stat, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return stat{}, err
	}
	return stat{dev: st.Dev, ino: st.Ino, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, nil
}

// stamped is a path and its stat.
type stamped struct {
	path string
	st   stat
}

// outsideEntry is one path the read rules grant: a directory tree, or a
// single file. fd is an O_PATH descriptor the host keeps for it, or -1
// when it is opened per call (a mount root: a kept descriptor would keep
// the mount busy, and the operator could not unmount it).
type outsideEntry struct {
	path string
	file bool
	// ino and dev are the entry's identity as listed; fd, when kept, was
	// checked to be that very file.
	ino, dev uint64
	fd       int
	// seq is the generation of the listing this entry first appeared in
	// (kept while it stays the same file): a pooled ruleset synced to an
	// older generation lacks exactly the entries with a higher seq.
	seq uint64
}

// listing is the read rules for everything outside the hidden roots, and
// the directories listed to make them. A listing replaced while calls
// still add its descriptors to their rulesets closes them after the last.
type listing struct {
	entries []outsideEntry
	walked  []stamped
	// settled says every listed directory was unchanged for
	// listingSettle before the listing; an unsettled one is listed again
	// by the next call.
	settled bool
	users   int
	retired bool
	// gen numbers the host's listings (1, 2, ...); epoch changes when a
	// listing found an entry of the one before it gone but not deleted
	// (moved, renamed, replaced, or not checkable): a rule for such a
	// file's inode could now grant something at its new place, so every
	// pooled ruleset older than epoch is dropped (pool.go).
	gen, epoch uint64
}

// fresh reports whether every listed directory is as it was.
func (l *listing) fresh() bool {
	if !l.settled {
		return false
	}
	for _, w := range l.walked {
		if st, err := stamp(w.path); err != nil || st != w.st {
			return false
		}
	}
	return true
}

func (l *listing) close() {
	for _, e := range l.entries {
		if e.fd >= 0 {
			unix.Close(e.fd)
		}
	}
}

// newListing lists the outside and opens what it may keep open. An entry
// that prev kept a descriptor for and that is still the same file (same
// name, device and inode) takes prev's descriptor over when prev is done
// with it, or a duplicate, so a change in a busy directory costs a listing
// and the new entries, not an open per entry.
//
// At most budget descriptors are kept (keepBudget): anyone may fill /tmp
// with entries, and the toolhost's own descriptors (connections, pipes, the
// store) must not run out because of them; the rest are opened per call.
//
// movedAway are the entries of prev gone from the new listing and not
// deleted (their kept descriptor's link count is not 0, or none was kept):
// such a file still exists somewhere, perhaps under a hidden root. A file
// gone counts as moved even when deleted: a rule on it keeps its inode, and
// so its blocks, allocated while the ruleset is pooled (a 200 MB file
// deleted on tmpfs would stay in memory); a deleted directory holds no data
// (a build's scratch directories come and go without dropping the pool).
func newListing(hidden []string, prev *listing, budget int, gen uint64) (l *listing, movedAway []string, err error) {
	entries, walked, err := listOutside(hidden)
	if err != nil {
		return nil, nil, err
	}
	kept := 0
	var held map[string]*outsideEntry
	matched := map[*outsideEntry]bool{}
	if prev != nil {
		held = make(map[string]*outsideEntry, len(prev.entries))
		for i := range prev.entries {
			held[prev.entries[i].path] = &prev.entries[i]
		}
	}
	for i := range entries {
		e := &entries[i]
		e.seq = gen
		if old := held[e.path]; old != nil && old.file == e.file && old.ino == e.ino && old.dev == e.dev {
			e.seq = old.seq
			matched[old] = true
			if kept < budget && old.fd >= 0 {
				if prev.users == 0 && prev.retired {
					e.fd, old.fd = old.fd, -1
				} else if fd, err := unix.FcntlInt(uintptr(old.fd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
					e.fd = fd
				}
				if e.fd >= 0 {
					kept++
					continue
				}
			}
		}
		if kept >= budget || mountRoot(e.path) {
			continue // opened per call
		}
		fd, err := unix.Open(e.path, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // opened (or found gone) per call
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Ino != e.ino || st.Dev != e.dev {
			unix.Close(fd) // replaced since the listing: opened per call
			continue
		}
		e.fd = fd
		kept++
	}
	if prev != nil {
		for i := range prev.entries {
			if old := &prev.entries[i]; !matched[old] && (old.file || !deleted(old.fd)) {
				movedAway = append(movedAway, old.path)
			}
		}
	}
	return &listing{entries: entries, walked: walked, gen: gen}, movedAway, nil
}

// deleted reports whether fd (an O_PATH descriptor, or -1 for none) is a
// file with no name left: a rule on it can grant nothing any more.
func deleted(fd int) bool {
	var st unix.Stat_t
	return fd >= 0 && unix.Fstat(fd, &st) == nil && st.Nlink == 0
}

// maxKept bounds the descriptors a listing keeps open.
const maxKept = 4096

// keepBudget is how many descriptors a listing may keep: maxKept, or an
// eighth of the open-file limit when that is lower.
func keepBudget() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 64
	}
	if rl.Cur == unix.RLIM_INFINITY {
		return maxKept
	}
	return int(min(uint64(maxKept), rl.Cur/8))
}

// mountRoot reports whether p is (or may be) the root of a mount.
func mountRoot(p string) bool {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil {
		return true
	}
	is, known := mountRootAttr(&stx)
	return !known || is
}

// mountRootAttr is statx's mount-root attribute: whether stx is a mount
// root, and whether the kernel reported it at all (each caller decides
// which way an unknown answer leans).
func mountRootAttr(stx *unix.Statx_t) (is, known bool) {
	known = stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0
	return known && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, known
}

// readListing keeps a host's listing.
type readListing struct {
	hidden []string
	mu     sync.Mutex
	cur    *listing // nil: none worth keeping
	// gen and epoch are the last listing's (see listing).
	gen, epoch uint64
}

// get returns the listing, made again when a listed directory changed;
// release it with put.
func (r *readListing) get() (*listing, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && r.cur.fresh() {
		r.cur.users++
		return r.cur, nil
	}
	// Listed under the lock: a change is listed once, not by every call
	// that notices it, and the previous listing hands its descriptors on.
	start := time.Now()
	prev := r.cur
	if prev != nil {
		prev.retired = true
	}
	r.gen++
	l, movedAway, err := newListing(r.hidden, prev, keepBudget(), r.gen)
	if prev != nil {
		r.cur = nil
		r.retire(prev)
	}
	if err != nil {
		r.epoch++ // the next listing has nothing to compare with
		return nil, err
	}
	if prev == nil || len(movedAway) > 0 {
		r.epoch++
	}
	l.epoch = r.epoch
	l.users = 1
	r.cur = l
	for _, w := range l.walked {
		if start.Sub(time.Unix(0, max(w.st.mtime, w.st.ctime))) < listingSettle {
			// Changed just now: the times may not show a change in the same
			// tick, so the next call lists again (taking the descriptors over).
			return l, nil
		}
	}
	l.settled = true
	return l, nil
}

// put releases a listing from get.
func (r *readListing) put(l *listing) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l.users--
	if l.retired && l.users == 0 {
		l.close()
	}
}

// retire closes l once its last user is done (r.mu held).
func (r *readListing) retire(l *listing) {
	l.retired = true
	if l.users == 0 {
		l.close()
	}
}

// close closes the kept listing (no call may be in flight).
func (r *readListing) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		r.retire(r.cur)
		r.cur = nil
	}
}

// callRuleset is one call's ruleset: read everything but the hidden roots
// (minus read), write only write and the sinks, no TCP when the network is
// off, no signals or abstract sockets out of the domain. read and write are
// the call's own directories, opened by openRuleDir (no symbolic link in
// their paths): their rules are added by those descriptors, never by path,
// so a directory swapped for a link after the host checked it cannot
// take a rule to the link's target. The returned descriptor is
// close-on-exec; a ruleset that would restrict nothing (a kernel too old
// for the rules) is an error: confinement fails closed.
func callRuleset(outside *listing, read, write []*os.File, network bool) (int, error) {
	cfg := landlock.V11.BestEffort()
	if network {
		cfg.HandledAccessNet = 0
	}
	fd, flags, err := cfg.NewRulesetFD(landlock.RWFiles(sinks...).IgnoreIfMissing())
	if err != nil {
		return -1, err
	}
	if flags != 0 { // the launcher enforces with flags 0: fail closed
		unix.Close(fd)
		return -1, fmt.Errorf("landlock ruleset needs restrict flags %#x the launcher does not pass", flags)
	}
	if fd < 0 {
		return -1, errors.New("landlock would enforce nothing on this kernel")
	}
	err = addDirs(fd, read, readDirAccess)
	if err == nil && len(write) > 0 {
		var handled uint64
		if handled, err = handledFS(); err == nil {
			err = addDirs(fd, write, writeDirAccess&handled)
		}
	}
	if err == nil {
		err = addOutside(fd, outside, 0)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// writeDirAccess is what landlock.RWDirs(...).WithRefer() grants, before
// it is cut to the rights the kernel's ABI handles.
const writeDirAccess = readDirAccess | llsys.AccessFSWriteFile | llsys.AccessFSRemoveDir | llsys.AccessFSRemoveFile |
	llsys.AccessFSMakeChar | llsys.AccessFSMakeDir | llsys.AccessFSMakeReg | llsys.AccessFSMakeSock | llsys.AccessFSMakeFifo |
	llsys.AccessFSMakeBlock | llsys.AccessFSMakeSym | llsys.AccessFSTruncate | llsys.AccessFSRefer

// handledFS is the file-system rights a landlock.V11 best-effort ruleset
// handles on this kernel (go-landlock's downgrade: the ABI's own set),
// which a rule may not exceed.
func handledFS() (uint64, error) {
	abi, err := llsys.LandlockGetABIVersion()
	if err != nil {
		return 0, fmt.Errorf("landlock ABI: %w", err)
	}
	byABI := []landlock.Config{landlock.V1, landlock.V2, landlock.V3, landlock.V4, landlock.V5, landlock.V6,
		landlock.V7, landlock.V8, landlock.V9, landlock.V10, landlock.V11}
	if abi < 1 {
		return 0, errors.New("landlock would enforce nothing on this kernel")
	}
	return uint64(byABI[min(abi, len(byABI))-1].HandledAccessFS & landlock.V11.HandledAccessFS), nil
}

// addDirs adds a rule granting access beneath each directory, by its
// descriptor.
func addDirs(ruleset int, dirs []*os.File, access uint64) error {
	for _, d := range dirs {
		if err := llsys.LandlockAddPathBeneathRule(ruleset, &llsys.PathBeneathAttr{ParentFd: int(d.Fd()), AllowedAccess: access}, 0); err != nil {
			return fmt.Errorf("rule for %s: %w", d.Name(), err)
		}
	}
	return nil
}

// openRuleDir opens a directory the call's rules name (the session root,
// its spill directory, the call's temporary directory: real paths the
// host checked) with no symbolic link in any component, in one openat2
// (RESOLVE_NO_SYMLINKS, fileopen.Beneath of the path under itself): the
// directory opened is the one at that very path now. A path that has
// become, or now passes through, a link is fileopen.ErrEscapes: the call
// fails closed rather than grant the link's target. id is the directory's
// identity, read from the descriptor.
func openRuleDir(path string) (*os.File, inodeID, error) {
	f, err := fileopen.Beneath(path, path)
	if err != nil {
		return nil, inodeID{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, inodeID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		f.Close()
		return nil, inodeID{}, &os.PathError{Op: "open", Path: path, Err: unix.ENOTDIR}
	}
	return f, inodeID{st.Dev, st.Ino}, nil
}

// The read rights of the outside (those of landlock.RODirs and ROFiles);
// every Landlock ABI handles them.
const (
	readDirAccess  = llsys.AccessFSExecute | llsys.AccessFSReadFile | llsys.AccessFSReadDir
	readFileAccess = llsys.AccessFSExecute | llsys.AccessFSReadFile
)

// addOutside adds the listing's read rules for the entries newer than
// generation since (0: all): by the kept descriptor, else by opening the
// path (one that vanished or is another file since the listing is skipped).
func addOutside(ruleset int, l *listing, since uint64) error {
	for _, e := range l.entries {
		if e.seq <= since {
			continue
		}
		fd := e.fd
		if fd < 0 {
			// The entry's directory is opened with no link anywhere in its
			// path (an ancestor swapped for a link since the listing would
			// otherwise lead the rule elsewhere: ELOOP, skipped like a
			// vanished entry), the entry itself without following it.
			dir, err := fileopen.DirNoLinks(filepath.Dir(e.path))
			if err == nil {
				fd, err = unix.Openat(dir, filepath.Base(e.path), unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
				unix.Close(dir)
			}
			if err != nil {
				if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
					continue
				}
				return fmt.Errorf("open %s: %w", e.path, err)
			}
			if !listedFile(fd, &e) {
				// Replaced since the listing (a hard link to a hidden
				// file, say): the rule would grant that file wherever it
				// is; the next listing sees what is there now.
				unix.Close(fd)
				continue
			}
		}
		access := uint64(readDirAccess)
		if e.file {
			access = readFileAccess
		}
		err := llsys.LandlockAddPathBeneathRule(ruleset, &llsys.PathBeneathAttr{ParentFd: fd, AllowedAccess: access}, 0)
		if fd != e.fd {
			unix.Close(fd)
		}
		if err != nil {
			return fmt.Errorf("rule for %s: %w", e.path, err)
		}
	}
	return nil
}

// listedFile reports whether fd, opened by e's path, is the file e listed.
// A mount root is not what the listing saw (its directory entry names the
// directory mounted over), so one counts when it is a mount root still: of
// another device than e's directory (a link or rename cannot bring a file
// from another file system), or one statx says is a mount root; only
// root can mount.
func listedFile(fd int, e *outsideEntry) bool {
	var stx unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_INO, &stx) != nil {
		return false
	}
	dev := unix.Mkdev(stx.Dev_major, stx.Dev_minor)
	if stx.Ino == e.ino && dev == e.dev {
		return true
	}
	is, _ := mountRootAttr(&stx) // unknown: not a mount root, no rule
	return dev != e.dev || is
}

// sinks are the devices every mode may write.
var sinks = []string{"/dev/null", "/dev/zero", "/dev/full"}
