package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A confined call's ruleset is hundreds of rules (one per sibling on the
// way to the hidden roots), and adding them was most of the toolhost's own
// CPU per bash call. The rules depend on the listing and on what the call
// adds (its session's root and spill directory, the mode, the network), not
// on the call: a ruleset is pooled after its call ended and reused by the
// next call with the same additions, so such a call adds no rules at all.
//
// What makes reuse sound:
//   - One call at a time: a ruleset is taken out of the pool for its call and
//     put back only once every process of the call is gone (Run.Finish, after
//     Wait, and after the call's cgroup was removed), never after close.
//     The launcher adds its own /proc rule to the ruleset before it enforces
//     it, so a reused ruleset also holds a rule for each earlier call's
//     /proc: a procfs instance of a PID namespace that is dead by then,
//     which no path reaches; after maxRulesetUses calls it is dropped.
//   - Its temporary directory is its own (granted in workspace-write, as the
//     per-call directory was), emptied and set to 0700 again when it is put
//     back (emptyDir); one that cannot be reset drops the ruleset.
//   - The listing has not moved anything away since (listing.epoch): an entry
//     gone from a listing and not deleted may be anywhere now, inside a hidden
//     root too, and its rule would grant it there. Entries added since are
//     added to the ruleset when it is taken (entry seq), so it grants what a
//     fresh ruleset would. Directories deleted since (no link left) are
//     harmless; a file gone bumps the epoch even when deleted (the rule would
//     keep its blocks allocated). The first take of a new epoch drops every
//     older pooled ruleset, of idle keys too (sweep).
//   - The call's own paths (root, spill directory) are the same files as when
//     the ruleset was made: a root removed and made again, or moved, drops it.
//
// The shell never holds the descriptor (TestNoRulesetReachesTheShell): it
// could otherwise add rules to a ruleset later calls enforce.

// maxRulesetUses bounds the calls one pooled ruleset serves (each leaves a
// dead /proc rule in it).
const maxRulesetUses = 64

// maxPooled bounds the rulesets kept between calls (each is a descriptor,
// a directory and some kernel memory per rule); the least recently used
// goes first.
const maxPooled = 128

// pooledRuleset is a ruleset between calls, or taken by one.
type pooledRuleset struct {
	key string
	fd  int
	// dir is its temporary directory (TMPDIR of its calls).
	dir string
	// gen and epoch are those of the listing whose entries it holds.
	gen, epoch uint64
	// ids are the identities of the call's own paths when it was made.
	ids  []inodeID
	uses int
}

type inodeID struct{ dev, ino uint64 }

// rulesetPool keeps a host's rulesets between calls.
type rulesetPool struct {
	tmpRoot string
	mu      sync.Mutex
	free    []*pooledRuleset // oldest put first
	// epoch is the newest listing epoch a take saw: rulesets of older
	// epochs are dropped, those of idle keys too (sweep).
	epoch uint64
	// closed says close ran: a ruleset put back later is dropped.
	closed bool
	// reused counts the calls served by a pooled ruleset (tests).
	reused int
}

func newRulesetPool(tmpRoot string) *rulesetPool {
	return &rulesetPool{tmpRoot: tmpRoot}
}

// rulesetKey is what a call adds to the outside: its mode, network, and
// the paths it reads and writes.
func rulesetKey(mode Mode, network bool, read, write []string) string {
	return string(mode) + "\x00" + strconv.FormatBool(network) + "\x00" + strings.Join(read, "\x00") + "\x00\x00" + strings.Join(write, "\x00")
}

// take returns a ruleset for a call with these additions, from the pool
// when one is still sound for outside (adding the entries listed since it
// was made), else a new one. mode decides whether its directory is
// writable (workspace-write) or only TMPDIR. Hand it back with put or drop.
func (p *rulesetPool) take(outside *listing, mode Mode, network bool, read, write []string) (*pooledRuleset, error) {
	key := rulesetKey(mode, network, read, write)
	p.sweep(outside.epoch)
	// newer are rulesets made from a listing newer than the caller's (it
	// listed while this call waited): sound for the calls after this one,
	// so they go back to the pool.
	var newer []*pooledRuleset
	defer func() {
		for _, rs := range newer {
			p.repool(rs)
		}
	}()
	for {
		rs := p.pop(key)
		if rs == nil {
			break
		}
		if rs.epoch > outside.epoch || rs.gen > outside.gen {
			newer = append(newer, rs)
			continue
		}
		if rs.epoch != outside.epoch || !sameFiles(rs.ids, read, write) {
			p.drop(rs)
			continue
		}
		if rs.gen < outside.gen {
			if err := addOutside(rs.fd, outside, rs.gen); err != nil {
				p.drop(rs)
				return nil, err
			}
			rs.gen = outside.gen
		}
		p.mu.Lock()
		p.reused++
		p.mu.Unlock()
		return rs, nil
	}
	dir, err := os.MkdirTemp(p.tmpRoot, "call-")
	if err != nil {
		return nil, fmt.Errorf("call temp dir: %w", err)
	}
	rs := &pooledRuleset{key: key, fd: -1, dir: dir, gen: outside.gen, epoch: outside.epoch}
	if mode == WorkspaceWrite {
		write = append(write[:len(write):len(write)], dir)
	}
	// Each directory is opened once, with no link in its path: its rule is
	// added by that descriptor and its identity kept for reuse (sameFiles).
	dirs := make([]*os.File, 0, len(read)+len(write))
	defer func() {
		for _, f := range dirs {
			f.Close()
		}
	}()
	for _, path := range append(read[:len(read):len(read)], write...) {
		f, id, err := openRuleDir(path)
		if err != nil {
			p.drop(rs)
			return nil, err
		}
		dirs = append(dirs, f)
		rs.ids = append(rs.ids, id)
	}
	if rs.fd, err = callRuleset(outside, dirs[:len(read)], dirs[len(read):], network); err != nil {
		p.drop(rs)
		return nil, err
	}
	return rs, nil
}

// sameFiles reports whether read and write are still the directories ids
// says, each opened with no symbolic link in its path (openRuleDir): a
// root that now is, or resolves through, a link is not the same file,
// even when the link leads to the very directory the ruleset was made
// for.
func sameFiles(ids []inodeID, read, write []string) bool {
	if len(ids) < len(read)+len(write) {
		return false
	}
	for i, path := range append(read[:len(read):len(read)], write...) {
		f, id, err := openRuleDir(path)
		if err != nil {
			return false
		}
		f.Close()
		if id != ids[i] {
			return false
		}
	}
	return true
}

// sweep drops every pooled ruleset older than epoch the first time a take
// sees it, those of keys no call uses any more too: an older ruleset may
// hold a rule on a file moved since, or on a deleted file whose blocks the
// rule keeps allocated (listing.epoch).
func (p *rulesetPool) sweep(epoch uint64) {
	p.mu.Lock()
	if epoch <= p.epoch {
		p.mu.Unlock()
		return
	}
	p.epoch = epoch
	var stale []*pooledRuleset
	p.free = slices.DeleteFunc(p.free, func(rs *pooledRuleset) bool {
		old := rs.epoch < epoch
		if old {
			stale = append(stale, rs)
		}
		return old
	})
	p.mu.Unlock()
	for _, rs := range stale {
		p.drop(rs)
	}
}

// pop takes the most recently put ruleset for key out of the pool.
func (p *rulesetPool) pop(key string) *pooledRuleset {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if rs := p.free[i]; rs.key == key {
			p.free = slices.Delete(p.free, i, i+1)
			return rs
		}
	}
	return nil
}

// put pools rs after its call ended (every process of it gone): its
// directory is emptied, and a ruleset that served maxRulesetUses calls or
// whose directory cannot be emptied is dropped.
func (p *rulesetPool) put(rs *pooledRuleset) {
	rs.uses++
	if rs.uses >= maxRulesetUses || !emptyDir(rs.dir) {
		p.drop(rs)
		return
	}
	p.repool(rs)
}

// repool pools rs as it is, unless the pool was closed or swept past its
// epoch since it was taken (then it is dropped).
func (p *rulesetPool) repool(rs *pooledRuleset) {
	p.mu.Lock()
	if p.closed || rs.epoch < p.epoch {
		p.mu.Unlock()
		p.drop(rs)
		return
	}
	var evict *pooledRuleset
	if p.free = append(p.free, rs); len(p.free) > maxPooled {
		evict = p.free[0]
		p.free = slices.Delete(p.free, 0, 1)
	}
	p.mu.Unlock()
	if evict != nil {
		p.drop(evict)
	}
}

// drop closes rs and removes its directory.
func (p *rulesetPool) drop(rs *pooledRuleset) {
	if rs.fd >= 0 {
		unix.Close(rs.fd)
		rs.fd = -1
	}
	removeAll(rs.dir)
}

// close drops every pooled ruleset; one still taken by a call is dropped
// when it is put back.
func (p *rulesetPool) close() {
	p.mu.Lock()
	p.closed = true
	all := p.free
	p.free = nil
	p.mu.Unlock()
	for _, rs := range all {
		p.drop(rs)
	}
}

// emptyDir resets dir, a ruleset's temporary directory, for the next call:
// what it holds removed, its mode 0700 again (a call may chmod its TMPDIR;
// Landlock does not govern that). It reports false, and the ruleset is
// dropped, when dir is no longer this host's own directory, carries
// extended attributes a call could have set (an ACL a default for the next
// call's files), or cannot be emptied.
func emptyDir(dir string) bool {
	var st unix.Stat_t
	if unix.Lstat(dir, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != uint32(os.Geteuid()) {
		return false
	}
	if st.Mode&0o7777 != 0o700 && unix.Chmod(dir, 0o700) != nil {
		return false
	}
	if callXattrs(dir) {
		return false
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	if len(ents) == 0 {
		return true
	}
	for _, e := range ents {
		if removeAll(filepath.Join(dir, e.Name())) != nil {
			return false
		}
	}
	ents, err = os.ReadDir(dir)
	return err == nil && len(ents) == 0
}

// callXattrs reports whether path has (or may have) extended attributes
// other than the security modules' own.
func callXattrs(path string) bool {
	n, err := unix.Llistxattr(path, nil)
	if err != nil {
		return !errors.Is(err, unix.ENOTSUP)
	}
	if n == 0 {
		return false
	}
	buf := make([]byte, n+256)
	if n, err = unix.Llistxattr(path, buf); err != nil {
		return true
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !strings.HasPrefix(name, "security.") {
			return true
		}
	}
	return false
}

// removeAll is os.RemoveAll for what a call left: a directory it made
// unreadable or unwritable (chmod 000) is given back to its owner (u+rwx)
// first, which root needs not but a non-root host does.
func removeAll(path string) error {
	if os.RemoveAll(path) == nil {
		return nil
	}
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700) // before WalkDir reads it
		}
		return nil
	})
	return os.RemoveAll(path)
}
