package launcher

import (
	"reflect"
	"strings"
	"testing"
)

func TestArgsRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []Config{
		{Argv: []string{"bash", "-c", "true"}, Dir: "/w", Limits: Limits{CPUSeconds: 1, MemoryBytes: 2, Processes: 3, FileBytes: 4}},
		{Landlock: true, PIDNS: true, DropCaps: true, Cgroup: "/sys/fs/cgroup/x=y", Dir: "/a b/=c",
			Argv: []string{"bash", "-c", "echo -- dir=/etc landlock\n--"}, Limits: Limits{CPUSeconds: 600}},
	}
	for _, c := range tests {
		a := c.Args()
		if a[0] != Arg0 || a[1] != protocol {
			t.Fatalf("Args() = %q: no marker", a)
		}
		got, err := ParseArgs(a[2:])
		if err != nil {
			t.Fatalf("ParseArgs(%q): %v", a, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("round trip\n got %+v\nwant %+v", got, c)
		}
	}
}

// TestParseArgsRefuses: an unknown or malformed setting fails the launch
// (closed) rather than being skipped.
func TestParseArgsRefuses(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		nil,
		{"dir=/w"},
		{"dir=/w", "--"},
		{"nolandlock", "--", "bash"},
		{"limits=1,2,3", "--", "bash"},
		{"limits=1,2,3,-4", "--", "bash"},
		{"cgroup", "--", "bash"},
		{"landlock=no", "--", "bash"},
	} {
		if c, err := ParseArgs(args); err == nil {
			t.Errorf("ParseArgs(%q) = %+v, want an error", args, c)
		}
	}
}

func FuzzParseArgs(f *testing.F) {
	f.Add("dir=/w\x00limits=1,2,3,4\x00landlock\x00--\x00bash\x00-c\x00true")
	f.Add("pidns\x00cgroup=/x\x00--")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseArgs(strings.Split(s, "\x00"))
		if err != nil {
			return
		}
		if len(c.Argv) == 0 {
			t.Fatalf("accepted %q without a command", s)
		}
		again, err := ParseArgs(c.Args()[2:])
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("re-encoding %+v: %+v, %v", c, again, err)
		}
	})
}
