package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// pidsCgroups makes one pids cgroup per call under a parent made for this
// host: cgroup v2 when its pids controller is usable, else the v1 pids
// hierarchy (a hybrid host). RLIMIT_NPROC alone does not bind root.
type pidsCgroups struct {
	parent  string // this host's directory
	version int
	seq     atomic.Int64
}

// newPidsCgroups finds a usable pids hierarchy and creates this host's
// parent directory (named after the process and tag, unique per host: two
// hosts in one process each get their own), or returns an error saying why
// there is none.
func newPidsCgroups(tag string) (*pidsCgroups, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("dsh-toolhost-%d-%s", os.Getpid(), tag)
	var errs []error
	if m, ok := mounts["cgroup2"]; ok {
		dir := filepath.Join(m, own[""], name)
		if err := os.Mkdir(dir, 0o755); err == nil {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
			if strings.Contains(" "+string(b)+" ", " pids ") || strings.Contains(string(b), "pids") {
				if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+pids"), 0); err == nil {
					return &pidsCgroups{parent: dir, version: 2}, nil
				}
			}
			os.Remove(dir)
			errs = append(errs, errors.New("cgroup v2 has no pids controller"))
		} else {
			errs = append(errs, fmt.Errorf("cgroup v2: %w", err))
		}
	}
	if m, ok := mounts["pids"]; ok {
		dir := filepath.Join(m, own["pids"], name)
		if err := os.Mkdir(dir, 0o755); err == nil {
			return &pidsCgroups{parent: dir, version: 1}, nil
		} else {
			errs = append(errs, fmt.Errorf("cgroup v1 pids: %w", err))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no cgroup pids hierarchy mounted"))
	}
	return nil, errors.Join(errs...)
}

// cgroupMounts maps "cgroup2" and v1 controller names to mount points.
func cgroupMounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, pf := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(pf) < 3 {
			continue
		}
		switch pf[0] {
		case "cgroup2":
			out["cgroup2"] = fields[4]
		case "cgroup":
			for _, o := range strings.Split(pf[2], ",") {
				if o == "pids" {
					out["pids"] = fields[4]
				}
			}
		}
	}
	return out, sc.Err()
}

// ownCgroups maps controller ("" for v2) to this process's cgroup path.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// create makes a call's cgroup with pids.max set.
func (c *pidsCgroups) create(max uint64) (string, error) {
	dir := filepath.Join(c.parent, "call-"+strconv.FormatInt(c.seq.Add(1), 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatUint(max, 10)), 0); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// remove deletes a call's cgroup once its processes are gone (the last
// exits are accounted a moment after the launcher is reaped) and reports
// whether it is gone: a cgroup that still holds a process cannot be removed.
func remove(dir string) bool {
	for i := 0; i < 50; i++ {
		if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return true
		}
		time.Sleep(2 * time.Millisecond) // the kernel frees the last pids asynchronously
	}
	return false
}

// close removes the host's parent directory.
func (c *pidsCgroups) close() {
	entries, _ := os.ReadDir(c.parent)
	for _, e := range entries {
		if e.IsDir() {
			remove(filepath.Join(c.parent, e.Name()))
		}
	}
	remove(c.parent)
}
