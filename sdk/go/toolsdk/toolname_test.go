package toolsdk

import (
	"regexp"
	"strings"
	"testing"
)

// toolNameRE is the rule as a regular expression: validToolName must agree
// with it on every name.
var toolNameRE = regexp.MustCompile(toolNamePattern)

func TestValidToolName(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"bash", true},
		{"read_file", true},
		{"mcp-server_tool9", true},
		{strings.Repeat("a", 64), true},
		{"", false},
		{strings.Repeat("a", 65), false},
		{"has space", false},
		{"dot.name", false},
		{"slash/name", false},
		{"ümlaut", false},
		{"new\nline", false},
	} {
		if got := validToolName(tc.name); got != tc.want {
			t.Errorf("validToolName(%q) = %v, want %v", tc.name, got, tc.want)
		}
		if re := toolNameRE.MatchString(tc.name); re != tc.want {
			t.Errorf("the pattern says %v for %q, the table %v", re, tc.name, tc.want)
		}
	}
}

func FuzzValidToolName(f *testing.F) {
	for _, s := range []string{"bash", "", "a-b_c", "x y", strings.Repeat("z", 64), strings.Repeat("z", 65), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := validToolName(name), toolNameRE.MatchString(name); got != want {
			t.Fatalf("validToolName(%q) = %v, the pattern %s says %v", name, got, toolNamePattern, want)
		}
	})
}

func TestDefineRefusesABadName(t *testing.T) {
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, `tool name "bad name" must match `+toolNamePattern) {
			t.Fatalf("panic %q, want the name and the rule", msg)
		}
	}()
	RawTool("bad name", "d", []byte(`{"type":"object"}`), nil)
}
