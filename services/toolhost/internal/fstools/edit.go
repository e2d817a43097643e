package fstools

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// EditArgs are the edit tool's parameters.
type EditArgs struct {
	FilePath   string `json:"file_path" jsonschema:"required,description=Path of the file to edit, absolute or relative to the session's working directory."`
	OldString  string `json:"old_string" jsonschema:"required,description=The exact text to replace (non-empty). It must match exactly once unless replace_all is set."`
	NewString  string `json:"new_string" jsonschema:"required,description=The replacement text; must differ from old_string."`
	ReplaceAll bool   `json:"replace_all" jsonschema:"description=Replace every occurrence of old_string (default false)."`
}

func (f *FS) editTool() toolsdk.Tool {
	return toolsdk.Define("edit",
		"Replace an exact, literal string in a file, atomically. The file must have been read in this session and be unchanged since. old_string must match exactly one place unless replace_all is true; line endings are matched as the file uses them.",
		f.edit,
		toolsdk.PresentCall(func(a EditArgs) *toolsv1.ToolCallView {
			old := a.OldString
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Diff{Diff: &toolsv1.DiffCallView{
				Title:     a.FilePath,
				Diffs:     []*toolsv1.FileDiff{{Path: a.FilePath, OldText: &old, NewText: a.NewString}},
				Locations: []*toolsv1.FileLocation{{Path: a.FilePath}},
			}}}
		}),
		toolsdk.PresentResult(func(_ EditArgs, r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView { return presentMutation(r) }),
	)
}

func (f *FS) edit(ctx context.Context, call *toolsdk.Call, a EditArgs) (toolsdk.Result, error) {
	var bad []string
	if a.OldString == "" {
		bad = append(bad, `"old_string" must not be empty`)
	}
	if a.OldString == a.NewString {
		bad = append(bad, `"new_string" must differ from "old_string"`)
	}
	if len(bad) > 0 {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: bad}
	}
	t, err := f.conf.ResolveCall(call, a.FilePath, true)
	if err != nil {
		return toolsdk.Result{}, err
	}
	seen, observed := f.observed.Get(call.SessionID, t.Real)
	if !observed {
		return toolsdk.Result{}, fsError(CodeNotObserved, "edit requires reading %s first", t.Display)
	}
	unlock := f.locks.lock(t.Real)
	defer unlock()
	if ctx.Err() != nil {
		return toolsdk.Result{}, fsError(CodeAborted, "edit of %s aborted", t.Display)
	}
	cur, exists, err := readCurrent(t)
	if err != nil {
		return toolsdk.Result{}, err
	}
	if !exists {
		return toolsdk.Result{}, fsError(CodeStaleVersion, "%s no longer exists; it was deleted since it was last read", t.Display)
	}
	if versionOf(cur) != seen {
		return toolsdk.Result{}, fsError(CodeStaleVersion, "%s changed since it was last read; read it again before editing", t.Display)
	}
	oldB, newB, n := matchVariant(cur, a.OldString, a.NewString)
	switch {
	case n == 0:
		return toolsdk.Result{}, fsError(CodeEditNotFound, "old_string not found in %s", t.Display)
	case n > 1 && !a.ReplaceAll:
		return toolsdk.Result{}, fsError(CodeAmbiguousEdit, "old_string matches %d places in %s; add surrounding context to make it unique, or set replace_all", n, t.Display)
	}
	limit := 1
	if a.ReplaceAll {
		limit = -1
	}
	next := bytes.Replace(cur, oldB, newB, limit)
	if err := atomicWrite(t, next); err != nil {
		return toolsdk.Result{}, err
	}
	f.observed.Record(call.SessionID, t.Real, versionOf(next))

	diffs := editDiff(t.Display, lf(cur), lf(next), lf(oldB), lf(newB), a.ReplaceAll)
	msg := "Edit applied successfully."
	if a.ReplaceAll {
		msg = fmt.Sprintf("Edit applied successfully: replaced %d occurrences.", n)
	}
	res := toolsdk.Text(msg)
	res.Meta = mutationMeta{Operation: "edit", Path: t.Display, Diffs: toJSONDiffs(diffs)}
	return res, nil
}

// matchVariant picks the byte form of old/new to use: line endings converted
// to the file's own (CRLF files get CRLF snippets, LF files LF snippets), and
// the snippets as given when the converted form does not occur (mixed files).
func matchVariant(content []byte, oldS, newS string) (oldB, newB []byte, n int) {
	oldLF := strings.ReplaceAll(oldS, "\r\n", "\n")
	newLF := strings.ReplaceAll(newS, "\r\n", "\n")
	conv := func(s string) string { return s }
	if bytes.Contains(content, []byte("\r\n")) {
		conv = func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
	}
	for _, v := range [][2]string{{conv(oldLF), conv(newLF)}, {oldS, newS}} {
		if c := bytes.Count(content, []byte(v[0])); c > 0 {
			return []byte(v[0]), []byte(v[1]), c
		}
	}
	return nil, nil, 0
}
