package compact

import (
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// OmissionMarker stands for the middle of a pruned tool result.
const OmissionMarker = "\n\n[… tool output pruned by dsh to save context: the middle of this result was removed …]\n\n"

// Pruned is one tool result replaced by the pruning pass.
type Pruned struct {
	OriginalSeq, ReplacementSeq int64
	CallID                      string
	CharsBefore, CharsAfter     int
}

// pruneEvents returns, for every tool/result on the surface whose text is
// over the policy's threshold, its replacement: identical data but each
// long text block cut to head + OmissionMarker + tail, with surface_op
// replace of the original alone (semantics.md §7.6). A pruned result is
// under the threshold, so a second pass finds nothing: idempotent.
func pruneEvents(log *session.Log, p Policy) []*sessionv1.SessionEvent {
	nodes, _ := log.Surface()
	events := log.Events()
	var out []*sessionv1.SessionEvent
	for _, seq := range nodes {
		ev := events[seq]
		tr := ev.GetToolResult()
		if tr == nil || textChars(tr.GetContent()) <= p.PruneThresholdChars {
			continue
		}
		content := make([]*llmv1.ContentBlock, len(tr.GetContent()))
		for i, b := range tr.GetContent() {
			content[i] = b
			if t := b.GetText(); t != nil && utf8.RuneCountInString(t.GetText()) > p.PruneHeadChars+p.PruneTailChars+utf8.RuneCountInString(OmissionMarker) {
				content[i] = session.Text(cut(t.GetText(), p.PruneHeadChars, p.PruneTailChars))
			}
		}
		pruned := proto.CloneOf(tr) // identical data but the content (§3.5)
		pruned.Content = content
		out = append(out, &sessionv1.SessionEvent{
			SurfaceOp: session.ReplaceOp(seq, seq), SourceEventSeqs: session.Seqs(seq),
			Payload: &sessionv1.SessionEvent_ToolResult{ToolResult: pruned}})
	}
	return out
}

// Prune runs the model-free pass on s and returns what it replaced.
func Prune(s Session, p Policy) ([]Pruned, error) {
	p = p.withDefaults()
	var out []Pruned
	for _, ev := range pruneEvents(s.Log, p) {
		orig := ev.GetSurfaceOp().GetReplace().GetStart()
		before := textChars(s.Log.Events()[orig].GetToolResult().GetContent())
		got, err := s.Append(ev)
		if err != nil {
			return out, err
		}
		out = append(out, Pruned{OriginalSeq: orig, ReplacementSeq: got.GetSeq(), CallID: ev.GetToolResult().GetCallId(),
			CharsBefore: before, CharsAfter: textChars(ev.GetToolResult().GetContent())})
	}
	return out, nil
}

func textChars(bs []*llmv1.ContentBlock) int {
	n := 0
	for _, b := range bs {
		if t := b.GetText(); t != nil {
			n += utf8.RuneCountInString(t.GetText())
		}
	}
	return n
}

// cut keeps the first head and last tail code points of s around the
// marker.
func cut(s string, head, tail int) string {
	i, n := 0, 0
	for n < head && i < len(s) {
		_, w := utf8.DecodeRuneInString(s[i:])
		i += w
		n++
	}
	j, m := len(s), 0
	for m < tail && j > i {
		_, w := utf8.DecodeLastRuneInString(s[:j])
		j -= w
		m++
	}
	return s[:i] + OmissionMarker + s[j:]
}
