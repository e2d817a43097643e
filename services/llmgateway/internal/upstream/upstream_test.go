package upstream

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

func client(idle time.Duration) *Client {
	return &Client{HTTP: &http.Client{Transport: NewTransport()}, UserAgent: "dsh/test", IdleTimeout: idle}
}

const events = "data: a\n\ndata: b\n\ndata: c\n\n"

// TestIdleExcludesConsumerTime: a consumer slower than the idle bound does
// not trip the watchdog, because it runs only while waiting on the
// provider. The bound is 150 ms (the consumer takes 3× as long per event):
// with 30 ms the provider's own answer, under -race on a loaded 2-core
// machine, sometimes took longer than the bound (1 run in 30).
func TestIdleExcludesConsumerTime(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: []byte(events)})
	s, f := client(150*time.Millisecond).Open(t.Context(), Request{Name: "p", URL: up.URL})
	if f != nil {
		t.Fatal(f)
	}
	defer s.Close()
	var got []string
	for {
		ev, f := s.Next()
		if f != nil {
			if f.Code != provider.CodeStreamClosed {
				t.Fatalf("failure %v after %v", f, got)
			}
			break
		}
		got = append(got, string(ev.Data))
		time.Sleep(450 * time.Millisecond) // a slow consumer, not a wait for an event
	}
	if strings.Join(got, "") != "abc" {
		t.Errorf("events = %v", got)
	}
}

func TestOpenFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		reply  providertest.Reply
		cancel bool
		code   string
	}{
		{"headers stall past the idle bound", providertest.Reply{StallHeaders: true}, false, provider.CodeTimeout},
		{"caller cancels while waiting for headers", providertest.Reply{StallHeaders: true}, true, provider.CodeAborted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := providertest.Serve(t, tt.reply)
			idle := 50 * time.Millisecond
			if tt.cancel {
				idle = time.Minute
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.cancel {
				go func() {
					// Cancel once the upstream has the request.
					for len(up.Requests()) == 0 {
						time.Sleep(time.Millisecond)
					}
					cancel()
				}()
			}
			_, f := client(idle).Open(ctx, Request{Name: "p", URL: up.URL})
			if f == nil || f.Code != tt.code {
				t.Fatalf("failure = %v, want %s", f, tt.code)
			}
			select {
			case <-up.Cancelled():
			case <-time.After(5 * time.Second):
				t.Fatal("upstream request not cancelled")
			}
		})
	}
}

func TestBadURL(t *testing.T) {
	t.Parallel()
	_, f := client(0).Open(t.Context(), Request{Name: "p", URL: "http://[::1"})
	if f == nil || f.Code != provider.CodeInvalidRequest {
		t.Fatalf("failure = %v", f)
	}
}

func TestErrorDetail(t *testing.T) {
	t.Parallel()
	tests := []struct{ body, kind, msg string }{
		{`{"error":{"message":"m","type":"t","code":"c"}}`, "t c", "m"},
		{`{"error":{"message":"m","type":"t","code":null}}`, "t", "m"},
		{`{"error":"plain"}`, "", "plain"},
		{`{"message":"top"}`, "", "top"},
		{`not json`, "", ""},
	}
	for _, tt := range tests {
		kind, msg := OpenAIErrorDetail([]byte(tt.body))
		if kind != tt.kind || msg != tt.msg {
			t.Errorf("OpenAIErrorDetail(%s) = %q, %q", tt.body, kind, msg)
		}
	}
}

func TestWatchedReaderArmsOnlyDuringRead(t *testing.T) {
	t.Parallel()
	fired := make(chan struct{})
	w := newWatchdog(20*time.Millisecond, func() { close(fired) })
	defer w.stop()
	r := watchedReader{r: strings.NewReader("x"), wd: w}
	if _, err := r.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fired:
		t.Fatal("watchdog fired while disarmed")
	case <-time.After(60 * time.Millisecond):
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	br := watchedReader{r: blockingReader(release), wd: w}
	go func() { _, _ = br.Read(nil) }()
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("watchdog did not fire during a blocked read")
	}
}

// blockingReader blocks until its channel is closed.
type blockingReader chan struct{}

func (b blockingReader) Read([]byte) (int, error) { <-b; return 0, io.EOF }
