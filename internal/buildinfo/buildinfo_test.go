package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	tests := []struct {
		name, version, want string
	}{
		{"recorded", "", "agent "},
		{"linked", "v9.9.9", "agent v9.9.9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old := Version
			Version = tc.version
			defer func() { Version = old }()
			got := String("agent")
			if !strings.HasPrefix(got, tc.want) || !strings.HasSuffix(got, runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) {
				t.Fatalf("String = %q, want prefix %q and the Go version", got, tc.want)
			}
		})
	}
}

func TestRequested(t *testing.T) {
	tests := []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--version"}, true},
		{[]string{"-version"}, true},
		{[]string{"--listen", "x", "--version=true"}, true},
		{[]string{"sessions", "list", "--version"}, true},
		{[]string{"--", "--version"}, false},
		{[]string{"--versions"}, false},
		{[]string{"--version=false"}, false},
	}
	for _, tt := range tests {
		if got := Requested(tt.args); got != tt.want {
			t.Errorf("Requested(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}
