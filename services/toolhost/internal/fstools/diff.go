package fstools

import (
	"strings"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// contextLines is the context kept around each applied hunk.
const contextLines = 3

// lf normalises line endings and invalid UTF-8 for display diffs.
func lf(b []byte) string {
	return strings.ToValidUTF8(strings.ReplaceAll(string(b), "\r\n", "\n"), "\uFFFD")
}

// span is a changed line range [start, end) in the old and new texts.
type span struct{ oldStart, oldEnd, newStart, newEnd int }

// hunks renders changed spans as FileDiffs with context lines, merging spans
// whose context overlaps. Inputs are LF text split into lines.
func hunks(path string, oldLines, newLines []string, spans []span) []*toolsv1.FileDiff {
	var out []*toolsv1.FileDiff
	var cur *span
	flush := func() {
		if cur == nil {
			return
		}
		os := max(cur.oldStart-contextLines, 0)
		ns := max(cur.newStart-contextLines, 0)
		oe := min(cur.oldEnd+contextLines, len(oldLines))
		ne := min(cur.newEnd+contextLines, len(newLines))
		old := strings.Join(oldLines[os:oe], "\n")
		out = append(out, &toolsv1.FileDiff{Path: path, OldText: &old, NewText: strings.Join(newLines[ns:ne], "\n")})
		cur = nil
	}
	for _, s := range spans {
		if cur != nil && s.oldStart-cur.oldEnd <= 2*contextLines {
			cur.oldEnd, cur.newEnd = s.oldEnd, s.newEnd
			continue
		}
		flush()
		c := s
		cur = &c
	}
	flush()
	return out
}

// wholeDiff is the applied hunk of a whole-file replacement: the region
// between the common prefix and suffix lines, with context.
func wholeDiff(path string, before, after string) []*toolsv1.FileDiff {
	a, b := strings.Split(before, "\n"), strings.Split(after, "\n")
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	if p == len(a) && p == len(b) {
		return nil
	}
	return hunks(path, a, b, []span{{p, len(a) - s, p, len(b) - s}})
}

// editDiff is the applied hunks of an edit in LF text: every
// non-overlapping site of oldSnip in before (the first only unless all),
// one span per site, merged where their context overlaps.
func editDiff(path, before, after, oldSnip, newSnip string, all bool) []*toolsv1.FileDiff {
	if oldSnip == "" {
		return wholeDiff(path, before, after)
	}
	dOld, dNew := strings.Count(oldSnip, "\n"), strings.Count(newSnip, "\n")
	var spans []span
	shift, pos := 0, 0
	for {
		i := strings.Index(before[pos:], oldSnip)
		if i < 0 {
			break
		}
		off := pos + i
		start := strings.Count(before[:off], "\n")
		spans = append(spans, span{start, start + dOld + 1, start + shift, start + shift + dNew + 1})
		shift += dNew - dOld
		pos = off + len(oldSnip)
		if !all {
			break
		}
	}
	if len(spans) == 0 {
		return wholeDiff(path, before, after)
	}
	return hunks(path, strings.Split(before, "\n"), strings.Split(after, "\n"), spans)
}
