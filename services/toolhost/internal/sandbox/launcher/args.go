package launcher

import (
	"errors"
	"strconv"
	"strings"
)

// protocol is argv[1] of a launcher run: it names this encoding, so a
// launcher and a toolhost from different builds refuse each other (the
// call fails closed) instead of misreading the arguments.
const protocol = "dsh-launch-v2"

// Args is the launcher's argv for c: Arg0, the protocol marker, one
// "key=value" or flag word per setting, "--", then the command's argv
// verbatim. A plain word list, not JSON: decoding it costs the launcher
// (started once per call) no reflection and no encoding/json init.
func (c Config) Args() []string {
	a := []string{Arg0, protocol, "dir=" + c.Dir,
		"limits=" + strconv.FormatUint(c.Limits.CPUSeconds, 10) + "," + strconv.FormatUint(c.Limits.MemoryBytes, 10) + "," +
			strconv.FormatUint(c.Limits.Processes, 10) + "," + strconv.FormatUint(c.Limits.FileBytes, 10)}
	if c.Cgroup != "" {
		a = append(a, "cgroup="+c.Cgroup)
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{c.Landlock, "landlock"}, {c.PIDNS, "pidns"}, {c.DropCaps, "dropcaps"}} {
		if f.on {
			a = append(a, f.name)
		}
	}
	a = append(a, "--")
	return append(a, c.Argv...)
}

// ParseArgs decodes what follows the protocol marker in Args. Anything it
// does not know is an error (the launcher then fails closed).
func ParseArgs(args []string) (Config, error) {
	var c Config
	for i, a := range args {
		if a == "--" {
			c.Argv = args[i+1:]
			if len(c.Argv) == 0 {
				return Config{}, errors.New("no command")
			}
			return c, nil
		}
		key, val, hasVal := strings.Cut(a, "=")
		var err error
		switch {
		case key == "dir" && hasVal:
			c.Dir = val
		case key == "cgroup" && hasVal && val != "":
			c.Cgroup = val
		case key == "limits" && hasVal:
			c.Limits, err = parseLimits(val)
		case a == "landlock":
			c.Landlock = true
		case a == "pidns":
			c.PIDNS = true
		case a == "dropcaps":
			c.DropCaps = true
		default:
			err = errors.New("unknown setting " + strconv.Quote(a))
		}
		if err != nil {
			return Config{}, err
		}
	}
	return Config{}, errors.New("no \"--\" before the command")
}

func parseLimits(s string) (Limits, error) {
	f := strings.Split(s, ",")
	if len(f) != 4 {
		return Limits{}, errors.New("limits: want cpu,memory,processes,file-size")
	}
	var v [4]uint64
	for i := range f {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return Limits{}, errors.New("limits: " + err.Error())
		}
		v[i] = n
	}
	return Limits{CPUSeconds: v[0], MemoryBytes: v[1], Processes: v[2], FileBytes: v[3]}, nil
}
