// Package title names sessions (semantics.md §7.11): after a session's first
// completed turn with a human prompt, one cheap model call (purpose TITLE,
// on the configured title route or the session's own) writes a
// session/title event with source "model". The call runs beside the
// session and never delays it; a failure is logged and retried after the
// next completed turn.
package title

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// SourceModel is the source of a generated title.
const SourceModel = "model"

// Instruction is the system prompt of a title call.
const Instruction = "You name conversations. Reply with a short title (at most 8 words) for the conversation that starts with the user's message below: plain text on one line, no quotes, no trailing punctuation."

// LLM is the model seam (the gateway client).
type LLM interface {
	Generate(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error]
}

// Config configures a Titler.
type Config struct {
	// Provider and Model route title calls (a small model); empty means the
	// session's own.
	Provider, Model string
	// MaxBytes caps a title; zero means 100.
	MaxBytes int
	// MaxPromptBytes caps the prompt text sent; zero means 4000.
	MaxPromptBytes int
	// Timeout bounds one call; zero means 30 s.
	Timeout time.Duration
	// Disabled turns titles off.
	Disabled bool
}

// Titler watches sessions and titles them.
type Titler struct {
	llm LLM
	cfg Config
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex // orders wg.Add against Close's Wait
	closed bool
	wg     sync.WaitGroup
}

// New returns a Titler; Close stops its calls.
func New(llm LLM, cfg Config, logger *slog.Logger) *Titler {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 100
	}
	if cfg.MaxPromptBytes <= 0 {
		cfg.MaxPromptBytes = 4000
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Titler{llm: llm, cfg: cfg, log: logger, ctx: ctx, cancel: cancel}
}

// Close cancels running calls, waits for them and starts no more.
func (t *Titler) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
}

// begin registers a call unless the Titler is closed.
func (t *Titler) begin() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

// Wait waits for the calls running now (tests and orderly shutdowns).
func (t *Titler) Wait() { t.wg.Wait() }

// Watch titles the session of log once: after a completed turn, when the
// log has a human prompt and no title yet. appendFn appends out of band.
// The returned stop ends the watch.
func (t *Titler) Watch(log *session.Log, appendFn func(*sessionv1.SessionEvent) error) (stop func()) {
	if t.cfg.Disabled {
		return func() {}
	}
	var busy, done atomic.Bool
	return log.Observe(func(ev *sessionv1.SessionEvent) {
		if done.Load() || ev.GetTurnEnd().GetReason().GetCompleted() == nil || !busy.CompareAndSwap(false, true) {
			return
		}
		if !t.begin() {
			busy.Store(false)
			return
		}
		go func() {
			defer t.wg.Done()
			defer busy.Store(false)
			ok, err := t.title(log, appendFn)
			if err != nil {
				t.log.Warn("session title failed; retrying after the next turn", "session", log.Header().GetId(), "err", err)
			}
			if ok {
				done.Store(true)
			}
		}()
	})
}

// title reports whether the session is titled (now or before).
func (t *Titler) title(log *session.Log, appendFn func(*sessionv1.SessionEvent) error) (bool, error) {
	evs := log.Events()
	var prompts []string
	for _, ev := range evs {
		if ev.GetSessionTitle() != nil {
			return true, nil
		}
		if s := HumanText(ev.GetUserMessage()); s != "" {
			prompts = append(prompts, s)
		}
	}
	if len(prompts) == 0 {
		return false, nil
	}
	o := log.Settings().Options // a session/model switches the route
	provider, model := t.cfg.Provider, t.cfg.Model
	if provider == "" || model == "" {
		provider, model = o.GetProvider(), o.GetModel()
	}
	if provider == "" || model == "" {
		return true, nil // no route: nothing to ask, and asking again will not help
	}
	title, err := t.Generate(t.ctx, log.Header().GetId(), provider, model, prompts[0])
	if err != nil {
		return false, err
	}
	ev := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SessionTitle{SessionTitle: &sessionv1.SessionTitle{Title: title, Source: SourceModel}}}
	if err := appendFn(ev); err != nil {
		return false, fmt.Errorf("append session/title: %w", err)
	}
	return true, nil
}

// HumanText is the text of a human user/message (the display content when
// contexts were baked in), or "".
func HumanText(um *sessionv1.UserMessage) string {
	if um == nil || um.GetSource().GetUser() == nil {
		return ""
	}
	blocks := um.GetContent()
	if env := um.GetEnvelope(); env != nil {
		blocks = env.GetDisplayContent()
	}
	var parts []string
	for _, b := range blocks {
		if tx := b.GetText().GetText(); strings.TrimSpace(tx) != "" {
			parts = append(parts, tx)
		}
	}
	return strings.Join(parts, "\n")
}

// Generate makes one title call and returns the normalised title.
func (t *Titler) Generate(ctx context.Context, sessionID, provider, model, prompt string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	maxTokens := int32(40)
	req := &llmv1.GenerateRequest{
		Provider: provider, Model: model, System: &[]string{Instruction}[0], MaxTokens: &maxTokens,
		Purpose: llmv1.Purpose_PURPOSE_TITLE, SessionId: sessionID,
		Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{session.Text(Cut(prompt, t.cfg.MaxPromptBytes))}}},
	}
	var b strings.Builder
	for c, err := range t.llm.Generate(ctx, req) {
		if err != nil {
			return "", err
		}
		if d := c.GetTextDelta(); d != nil {
			b.WriteString(d.GetText())
		}
		r := c.GetFinish().GetReason()
		if f := r.GetError().GetFailure(); r.GetError() != nil || r.GetAborted() != nil {
			if f == nil {
				f = r.GetAborted().GetFailure()
			}
			return "", fmt.Errorf("title call: %s: %s", f.GetCode(), f.GetMessage())
		}
	}
	title := Normalize(b.String(), t.cfg.MaxBytes)
	if title == "" {
		return "", errors.New("title call: the model answered no text")
	}
	return title, nil
}

// Normalize makes a title of a model's answer: its first non-empty line,
// control characters dropped, whitespace collapsed, surrounding quotes and
// a "Title:" label removed, cut to maxBytes without splitting a code point.
func Normalize(s string, maxBytes int) string {
	for line := range strings.SplitSeq(s, "\n") {
		line = strings.Map(func(r rune) rune {
			if unicode.IsControl(r) {
				return ' '
			}
			return r
		}, line)
		line = strings.Join(strings.Fields(line), " ")
		if len(line) >= 6 && strings.EqualFold(line[:6], "title:") {
			line = strings.TrimSpace(line[6:])
		}
		line = strings.Trim(line, "\"'`*#“”‘’ ")
		line = strings.TrimRight(line, ".")
		if line != "" {
			return Cut(line, maxBytes)
		}
	}
	return ""
}

// Cut cuts s to at most n bytes without splitting a code point.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
