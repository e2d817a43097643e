package title_test

import (
	"context"
	"iter"
	"strings"
	"sync"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/title"
)

func TestNormalize(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"Fix the login test", "Fix the login test"},
		{"\n\n  \"Fix   the\tlogin test.\"  \nsecond line", "Fix the login test"},
		{"Title: **Release notes**", "Release notes"},
		{"bell\x07 inside", "bell inside"},
		{"   \n \n", ""},
		{"héllo wörld " + strings.Repeat("ß", 60), "héllo wörld " + strings.Repeat("ß", 43)}, // 100 bytes, no split rune
	}
	for _, tt := range tests {
		if got := title.Normalize(tt.in, 100); got != tt.want {
			t.Errorf("Normalize(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// llm is a fake gateway: it records requests and answers text or a failure.
type llm struct {
	mu   sync.Mutex
	reqs []*llmv1.GenerateRequest
	text string
	fail bool
}

func (f *llm) Generate(_ context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	return func(yield func(*llmv1.StreamChunk, error) bool) {
		if f.fail {
			yield(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: &llmv1.FinishReason{
				Kind: &llmv1.FinishReason_Error{Error: &llmv1.FinishError{Failure: &llmv1.LlmFailure{Code: "RATE_LIMIT", Message: "slow down"}}}}}}}, nil)
			return
		}
		yield(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: f.text}}}, nil)
	}
}

func newLog(t *testing.T) *session.Log {
	t.Helper()
	log, err := session.NewLog(&sessionv1.SessionHeader{Id: "s", Cwd: "/w", Options: &sessionv1.SessionOptions{Provider: "p", Model: "big"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return log
}

func completed() *sessionv1.TurnEndReason {
	return &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Completed{Completed: &sessionv1.EndCompleted{}}}
}

// turn appends a turn with the given user message (source src).
func turn(t *testing.T, log *session.Log, n int32, text string, src *llmv1.MessageSource) {
	t.Helper()
	for _, ev := range []*sessionv1.SessionEvent{
		session.TurnStartEvent(n, session.MessageTrigger(src)),
		session.UserMessageEvent([]*llmv1.ContentBlock{session.Text(text)}, src),
		session.TurnEndEvent(n, completed()),
	} {
		if _, err := log.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		cfg       title.Config
		fake      *llm
		src       *llmv1.MessageSource
		wantTitle string
		wantRoute string
		switchTo  *sessionv1.ModelChanged // a session/model before the prompt
	}{
		{"session route", title.Config{}, &llm{text: "Deploy the app"}, session.UserSource(), "Deploy the app", "p/big", nil},
		{"small title route", title.Config{Provider: "p", Model: "small"}, &llm{text: "Deploy"}, session.UserSource(), "Deploy", "p/small", nil},
		{"session/model switches the session route", title.Config{}, &llm{text: "Deploy"}, session.UserSource(), "Deploy", "q/other",
			&sessionv1.ModelChanged{Provider: "q", Model: "other"}},
		{"no human prompt: no call", title.Config{}, &llm{text: "x"}, session.PluginSource("cron"), "", "", nil},
		{"failure: no title", title.Config{}, &llm{fail: true}, session.UserSource(), "", "p/big", nil},
		{"disabled", title.Config{Disabled: true}, &llm{text: "x"}, session.UserSource(), "", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := title.New(tt.fake, tt.cfg, nil)
			log := newLog(t)
			var mu sync.Mutex
			var appended []*sessionv1.SessionEvent
			stop := tr.Watch(log, func(ev *sessionv1.SessionEvent) error {
				mu.Lock()
				defer mu.Unlock()
				appended = append(appended, ev)
				return nil
			})
			defer stop()
			n := int32(1)
			if tt.switchTo != nil {
				for _, ev := range []*sessionv1.SessionEvent{
					session.TurnStartEvent(n, session.InjectionTrigger(session.PluginSource("test"))),
					{Payload: &sessionv1.SessionEvent_ModelChanged{ModelChanged: tt.switchTo}},
					session.TurnEndEvent(n, completed()),
				} {
					if _, err := log.Append(ev); err != nil {
						t.Fatal(err)
					}
				}
				n++
				tr.Wait() // the watch saw no prompt yet; let it settle
			}
			turn(t, log, n, "deploy the app to staging", tt.src)
			tr.Close() // waits for the call
			var got string
			if len(appended) > 0 {
				got = appended[0].GetSessionTitle().GetTitle()
				if src := appended[0].GetSessionTitle().GetSource(); src != title.SourceModel {
					t.Errorf("source %q", src)
				}
			}
			if got != tt.wantTitle || len(appended) > 1 {
				t.Errorf("titles %v, want %q", appended, tt.wantTitle)
			}
			var route string
			if len(tt.fake.reqs) > 0 {
				r := tt.fake.reqs[0]
				route = r.GetProvider() + "/" + r.GetModel()
				if r.GetPurpose() != llmv1.Purpose_PURPOSE_TITLE || !strings.Contains(r.GetMessages()[0].GetContent()[0].GetText().GetText(), "deploy the app to staging") {
					t.Errorf("title request %v", r)
				}
			}
			if route != tt.wantRoute {
				t.Errorf("route %q, want %q", route, tt.wantRoute)
			}
		})
	}
}

// TestWatchOnce: a failed call leaves the session untitled and the next
// completed turn tries again; a titled session is never titled again.
func TestWatchOnce(t *testing.T) {
	t.Parallel()
	log := newLog(t)
	var titles []string
	appendTitle := func(ev *sessionv1.SessionEvent) error {
		titles = append(titles, ev.GetSessionTitle().GetTitle())
		_, err := log.Append(ev)
		return err
	}
	failing := title.New(&llm{fail: true}, title.Config{}, nil)
	stop := failing.Watch(log, appendTitle)
	turn(t, log, 1, "one", session.UserSource())
	failing.Close()
	stop()
	if len(titles) != 0 {
		t.Fatalf("titles after a failed call: %v", titles)
	}

	fake := &llm{text: "First"}
	tr := title.New(fake, title.Config{}, nil)
	defer tr.Close()
	stop = tr.Watch(log, appendTitle)
	defer stop()
	turn(t, log, 2, "two", session.UserSource())
	tr.Wait()
	turn(t, log, 3, "three", session.UserSource())
	tr.Close()
	if len(titles) != 1 || titles[0] != "First" || len(fake.reqs) != 1 {
		t.Fatalf("titles %v after %d calls, want one", titles, len(fake.reqs))
	}
	if !strings.Contains(fake.reqs[0].GetMessages()[0].GetContent()[0].GetText().GetText(), "one") {
		t.Errorf("the title is not of the first prompt: %v", fake.reqs[0])
	}
	if got := log.Settings().Title; got != "First" {
		t.Errorf("Settings().Title = %q", got)
	}
}
