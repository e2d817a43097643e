package cmdline

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestNoArgs(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"--listen", "x"}, ""},
		{[]string{"stray", "--listen", "x"}, `unexpected argument "stray": agent takes flags only`},
		{[]string{"--listen", "x", "--", "--listen"}, `unexpected argument "--listen"`},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.String("listen", "", "")
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		err := NoArgs(fs)
		if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("NoArgs after %q = %v, want %q", tt.args, err, tt.wantErr)
		}
	}
}
