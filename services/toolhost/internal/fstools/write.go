package fstools

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// WriteArgs are the write tool's parameters.
type WriteArgs struct {
	FilePath string `json:"file_path" jsonschema:"required,description=Path of the file to create or replace, absolute or relative to the session's working directory."`
	Content  string `json:"content" jsonschema:"required,description=The complete new content of the file."`
}

// mutationMeta is the write and edit tools' presentation payload: the
// applied hunks, so the completed diff card replays without the file.
type mutationMeta struct {
	Operation string      `json:"operation"`
	Path      string      `json:"path"`
	Diffs     []*diffJSON `json:"diffs"`
}

type diffJSON struct {
	Path    string  `json:"path"`
	OldText *string `json:"old_text"`
	NewText string  `json:"new_text"`
}

func toJSONDiffs(ds []*toolsv1.FileDiff) []*diffJSON {
	out := make([]*diffJSON, 0, len(ds))
	for _, d := range ds {
		out = append(out, &diffJSON{Path: d.GetPath(), OldText: d.OldText, NewText: d.GetNewText()})
	}
	return out
}

func decodeMeta(r *toolsv1.ToolExecutionResult, v any) bool {
	return r.Meta != nil && json.Unmarshal([]byte(r.GetMeta()), v) == nil
}

// presentMutation is the completed diff card of write and edit.
func presentMutation(r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
	var m mutationMeta
	if r.GetIsError() || !decodeMeta(r, &m) {
		return nil
	}
	dv := &toolsv1.DiffResultView{Title: m.Path}
	for _, d := range m.Diffs {
		dv.Diffs = append(dv.Diffs, &toolsv1.FileDiff{Path: d.Path, OldText: d.OldText, NewText: d.NewText})
	}
	return &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Diff{Diff: dv}}
}

func (f *FS) writeTool() toolsdk.Tool {
	return toolsdk.Define("write",
		"Create a file or replace its whole content, atomically. Overwriting an existing file requires reading it first in this session, and fails if it changed since.",
		f.write,
		toolsdk.PresentCall(func(a WriteArgs) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Diff{Diff: &toolsv1.DiffCallView{
				Title:     a.FilePath,
				Diffs:     []*toolsv1.FileDiff{{Path: a.FilePath, NewText: a.Content}},
				Locations: []*toolsv1.FileLocation{{Path: a.FilePath}},
			}}}
		}),
		toolsdk.PresentResult(func(_ WriteArgs, r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView { return presentMutation(r) }),
	)
}

func (f *FS) write(ctx context.Context, call *toolsdk.Call, a WriteArgs) (toolsdk.Result, error) {
	t, err := f.conf.ResolveCall(call, a.FilePath, true)
	if err != nil {
		return toolsdk.Result{}, err
	}
	unlock := f.locks.lock(t.Real)
	defer unlock()
	if ctx.Err() != nil {
		return toolsdk.Result{}, fsError(CodeAborted, "write of %s aborted", t.Display)
	}
	cur, exists, err := readCurrent(t)
	if err != nil {
		return toolsdk.Result{}, err
	}
	seen, observed := f.observed.Get(call.SessionID, t.Real)
	switch {
	case observed && !exists:
		return toolsdk.Result{}, fsError(CodeStaleVersion, "%s was deleted since it was last read; read it again or check before recreating it", t.Display)
	case observed && versionOf(cur) != seen:
		return toolsdk.Result{}, fsError(CodeStaleVersion, "%s changed since it was last read; read it again before writing", t.Display)
	case !observed && exists:
		return toolsdk.Result{}, fsError(CodeNotObserved, "%s already exists; read it before overwriting it", t.Display)
	}
	next := []byte(a.Content)
	if err := atomicWrite(t, next); err != nil {
		return toolsdk.Result{}, err
	}
	f.observed.Record(call.SessionID, t.Real, versionOf(next))

	op, verb := "create", "Created file"
	var diffs []*toolsv1.FileDiff
	if exists {
		op, verb = "update", "Updated file"
		if utf8.Valid(cur) {
			diffs = wholeDiff(t.Display, lf(cur), lf(next))
		}
	}
	if !exists || diffs == nil && !utf8.Valid(cur) {
		diffs = []*toolsv1.FileDiff{{Path: t.Display, NewText: lf(next)}}
	}
	res := toolsdk.Text(fmt.Sprintf("<path>%s</path>\n<type>file</type>\n<content>\n%s\n</content>", t.Display, verb))
	res.Meta = mutationMeta{Operation: op, Path: t.Display, Diffs: toJSONDiffs(diffs)}
	return res, nil
}
