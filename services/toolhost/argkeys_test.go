package toolhost_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestCaseVariantKeysAreRefused is an attacker's try at an approval rule:
// the agent's approval gate reads a call's subject from the arguments'
// exact keys (approval.SubjectOf: "file_path", "command"), while a Go
// tool's arguments were decoded with encoding/json, which also takes a key
// that differs only in case and lets the last one win. Arguments carrying
// the approved path under "file_path" and another under "FILE_PATH" were
// approved for the first and wrote the second. The host now refuses a key
// that matches a property only when case is ignored, and nothing is
// written.
func TestCaseVariantKeysAreRefused(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	for _, tc := range []struct {
		name, tool, args, written string
	}{
		{"a second key in other case", "write", `{"file_path":"approved.txt","content":"x","FILE_PATH":"other.txt"}`, "other.txt"},
		{"only the other case", "write", `{"File_Path":"other2.txt","content":"x"}`, "other2.txt"},
		{"a Unicode fold of a property (the long s folds to s)", "edit", `{"file_path":"approved3.txt","old_string":"a","new_string":"b","old_\u017ftring":"z"}`, "approved3.txt"},
		{"a Unicode fold of no property (the Kelvin sign folds to k)", "write", `{"file_path":"approved4.txt","content":"x","\u212aey":"y"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, r, err := h.Execute(t.Context(), "s", tc.tool, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if tc.written == "" { // a fold of no property: an extra key, allowed as before
				if r.GetIsError() {
					t.Fatalf("an extra key was refused: %v", r.GetContent())
				}
				return
			}
			if !r.GetIsError() || !strings.Contains(r.GetContent()[0].GetText().GetText(), "case") {
				t.Errorf("result %v, want an invalid-arguments error naming the key's case", r.GetContent())
			}
			if _, err := os.Stat(filepath.Join(h.Workspace, tc.written)); !os.IsNotExist(err) {
				t.Errorf("%s was written (stat: %v)", tc.written, err)
			}
		})
	}
}
