package sandbox

import (
	"bytes"
	"encoding/binary"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsh-dev/dsh/internal/fileopen"
)

// listOutside lists what read access to the whole filesystem except the
// hidden roots is granted on. Landlock only allows, so "everything but H"
// is spelled as the siblings of every directory on the way from / down to
// each H. Symlinks are skipped: a rule on a link would grant its target
// (which may be hidden), and every real target is reached by its own path
// anyway. walked are the directories listed, stamped before their
// listing: the list describes them as they were then (see stamp).
func listOutside(hidden []string) (outside []outsideEntry, walked []stamped, err error) {
	if len(hidden) == 0 {
		return []outsideEntry{{path: "/", fd: -1}}, nil, nil
	}
	var walk func(dir string) error
	walk = func(dir string) error {
		st, err := stamp(dir)
		if err != nil {
			return err
		}
		walked = append(walked, stamped{dir, st})
		entries, err := readDirents(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			p := strings.TrimSuffix(dir, "/") + "/" + e.name
			switch {
			case isHidden(p, hidden):
				continue
			case leadsToHidden(p, hidden):
				if err := walk(p); err != nil {
					return err
				}
				continue
			}
			typ := e.typ
			if typ == unix.DT_UNKNOWN { // a file system that does not say
				var lst unix.Stat_t
				if err := unix.Lstat(p, &lst); err != nil {
					continue
				}
				typ = uint8((lst.Mode & unix.S_IFMT) >> 12)
			}
			switch typ {
			case unix.DT_LNK:
			case unix.DT_DIR:
				outside = append(outside, outsideEntry{path: p, ino: e.ino, dev: st.dev, fd: -1})
			default:
				outside = append(outside, outsideEntry{path: p, file: true, ino: e.ino, dev: st.dev, fd: -1})
			}
		}
		return nil
	}
	if err := walk("/"); err != nil {
		return nil, nil, err
	}
	return outside, walked, nil
}

// dirent is a directory entry as getdents64 reports it.
type dirent struct {
	name string
	typ  uint8
	ino  uint64
}

// readDirents lists dir with its entries' inode numbers (which os.ReadDir
// does not report), without "." and "..".
func readDirents(dir string) ([]dirent, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	var out []dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "getdents", Path: dir, Err: err}
		}
		if n <= 0 {
			return out, nil
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return nil, &os.PathError{Op: "getdents", Path: dir, Err: unix.EIO}
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				out = append(out, dirent{name: s, typ: b[18], ino: binary.NativeEndian.Uint64(b[0:8])})
			}
			b = b[reclen:]
		}
	}
}

func isHidden(p string, hidden []string) bool {
	for _, h := range hidden {
		if p == h {
			return true
		}
	}
	return false
}

// leadsToHidden reports whether some hidden root lies strictly below p.
func leadsToHidden(p string, hidden []string) bool {
	for _, h := range hidden {
		if h != p && fileopen.Within(h, p) {
			return true
		}
	}
	return false
}
