package load

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// upstream is an OpenAI-compatible chat-completions fake: it waits delay
// (the model's latency), then streams a reply whose tool-call arguments
// arrive in 12-byte deltas, as real providers send them. While a turn has
// fewer than steps tool results it asks for one more call of tool;
// afterwards it answers with text.
//
// It identifies a conversation by its last user message and records, from
// its own clock, when each request arrived and when each response was
// finished, so the gap between one response and the next request of the
// same conversation is the time the harness added to that step (agent,
// gateway, toolhost and the tool itself).
type upstream struct {
	delay time.Duration
	steps int
	tool  string

	mu    sync.Mutex
	convs map[string]*conv
	bad   int // requests it could not parse
	// conns counts the connections the gateway opened to it: with the
	// gateway's pool working, about one per request in flight at once,
	// not one per request.
	conns atomic.Int64
}

// conv is one turn as the upstream saw it.
type conv struct {
	arrived, finished []time.Time
}

func newUpstream(delay time.Duration, steps int, tool string) *upstream {
	return &upstream{delay: delay, steps: steps, tool: tool, convs: make(map[string]*conv)}
}

// serve runs the upstream on a loopback listener until the returned stop
// is called; it returns the base URL.
func (u *upstream) serve() (url string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second, ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			u.conns.Add(1)
		}
	}}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String() + "/v1", func() { _ = srv.Close() }, nil
}

type chatRequest struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	if r.URL.Path == "/v1/models" {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"load","object":"model"}]}`)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req chatRequest
	key, tools := "", 0
	if err := json.Unmarshal(body, &req); err == nil {
		for _, m := range req.Messages {
			switch m.Role {
			case "user":
				key, tools = string(m.Content), 0
			case "tool":
				tools++
			}
		}
	}
	if key == "" {
		u.mu.Lock()
		u.bad++
		u.mu.Unlock()
		http.Error(w, "no user message", http.StatusBadRequest)
		return
	}
	if u.delay > 0 {
		select {
		case <-time.After(u.delay):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	head := `{"id":"c","object":"chat.completion.chunk","created":1,"model":"load","choices":[`
	chunk := func(s string) { fmt.Fprintf(w, "data: %s%s\n\n", head, s) }
	if tools < u.steps {
		chunk(`{"index":0,"delta":{"role":"assistant","content":"Step."},"finish_reason":null}]}`)
		var args string
		if u.tool == "bash" {
			args = fmt.Sprintf(`{"command":"echo step %d","description":"load step"}`, tools+1)
		} else {
			args = `{"file_path":"notes.txt"}`
		}
		for i := 0; i < len(args); i += 12 {
			part, _ := json.Marshal(args[i:min(i+12, len(args))])
			if i == 0 {
				chunk(fmt.Sprintf(`{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_%d","type":"function","function":{"name":%q,"arguments":%s}}]},"finish_reason":null}]}`, tools+1, u.tool, part))
			} else {
				chunk(fmt.Sprintf(`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":%s}}]},"finish_reason":null}]}`, part))
			}
		}
		chunk(`{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)
	} else {
		chunk(`{"index":0,"delta":{"role":"assistant","content":"All "},"finish_reason":null}]}`)
		chunk(`{"index":0,"delta":{"content":"done."},"finish_reason":null}]}`)
		chunk(`{"index":0,"delta":{},"finish_reason":"stop"}]}`)
	}
	chunk(`],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}`)
	fmt.Fprint(w, "data: [DONE]\n\n")
	w.(http.Flusher).Flush()
	finished := time.Now()
	u.mu.Lock()
	c := u.convs[key]
	if c == nil {
		c = &conv{}
		u.convs[key] = c
	}
	c.arrived = append(c.arrived, arrived)
	c.finished = append(c.finished, finished)
	u.mu.Unlock()
}

// gaps returns, over every conversation, the time from each response's end
// to the next request's arrival, sorted.
func (u *upstream) gaps() []time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []time.Duration
	for _, c := range u.convs {
		for i := 1; i < len(c.arrived); i++ {
			out = append(out, c.arrived[i].Sub(c.finished[i-1]))
		}
	}
	slices.Sort(out)
	return out
}

// reset forgets every conversation recorded so far (a warm-up's), so that
// gaps and requests count only what follows. conns is kept: the window
// reuses the warm-up's connections, so it counts every connection the
// gateway opened.
func (u *upstream) reset() {
	u.mu.Lock()
	defer u.mu.Unlock()
	clear(u.convs)
	u.bad = 0
}

// requests is the number of model requests answered.
func (u *upstream) requests() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.convs {
		n += len(c.arrived)
	}
	return n
}

// prompt is the user message of session i's turn t; the upstream keys its
// records on it (the gateway sends it as a JSON string or content parts).
func prompt(i, t int) string {
	return strings.Join([]string{"load", fmt.Sprint(i), "turn", fmt.Sprint(t)}, " ")
}

// percentile of sorted d (nearest rank).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(float64(len(d))*p+0.999999) - 1
	return d[max(0, min(i, len(d)-1))]
}
