package load

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// upstream is an OpenAI-compatible chat-completions fake: it waits delay
// (the model's latency; with jitter, a latency drawn uniformly from
// delay ± jitter for each request), then streams a reply whose tool-call arguments
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
	delay  time.Duration
	jitter time.Duration
	steps  int
	tool   string

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

func newUpstream(delay, jitter time.Duration, steps int, tool string) *upstream {
	return &upstream{delay: delay, jitter: min(jitter, delay), steps: steps, tool: tool, convs: make(map[string]*conv)}
}

// latency is how long the model takes to answer this request.
func (u *upstream) latency() time.Duration {
	if u.jitter <= 0 {
		return u.delay
	}
	return u.delay - u.jitter + rand.N(2*u.jitter+1)
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

// bodies recycles the request bodies' buffers: the upstream stands in for
// a provider on another machine, so its own work is kept small to leave
// the two cores to what is measured.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

type chatRequest struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

var (
	userRole = []byte(`{"role":"user","content":`)
	toolRole = []byte(`{"role":"tool",`)
)

// turnOf returns a chat-completions request's conversation key (the raw
// JSON of its last user message's content) and the number of tool
// results after that message; key is "" if the body has none.
//
// It reads the gateway's compact encoding (a message's role first, the
// user message's content next) without decoding the whole body: a
// quotation mark inside a JSON string is escaped, so the markers match
// only a message's own members. Any other shape takes a full decode.
func turnOf(body []byte) (key string, tools int) {
	if key, tools, ok := turnOfLean(body); ok {
		return key, tools
	}
	return turnOfDecoded(body)
}

// turnOfLean is turnOf's reading of the gateway's compact encoding; ok is
// false when body is not in it (then turnOfDecoded reads it).
func turnOfLean(body []byte) (key string, tools int, ok bool) {
	// The last user message, found forwards: bytes.Index is vectorised,
	// bytes.LastIndex is not.
	last := -1
	for i := 0; ; {
		j := bytes.Index(body[i:], userRole)
		if j < 0 {
			break
		}
		last = i + j
		i = last + len(userRole)
	}
	if last >= 0 {
		rest := body[last+len(userRole):]
		var raw json.RawMessage
		if err := json.NewDecoder(bytes.NewReader(rest)).Decode(&raw); err == nil {
			return string(raw), bytes.Count(rest, toolRole), true
		}
	}
	return "", 0, false
}

// turnOfDecoded is turnOf by a whole decode of body.
func turnOfDecoded(body []byte) (key string, tools int) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return "", 0
	}
	for _, m := range req.Messages {
		switch m.Role {
		case "user":
			key, tools = string(m.Content), 0
		case "tool":
			tools++
		}
	}
	return key, tools
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	if r.URL.Path == "/v1/models" {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"load","object":"model"}]}`)
		return
	}
	buf := bodies.Get().(*bytes.Buffer)
	buf.Reset()
	_, _ = buf.ReadFrom(r.Body)
	key, tools := turnOf(buf.Bytes())
	bodies.Put(buf)
	if key == "" {
		u.mu.Lock()
		u.bad++
		u.mu.Unlock()
		http.Error(w, "no user message", http.StatusBadRequest)
		return
	}
	if d := u.latency(); d > 0 {
		select {
		case <-time.After(d):
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

// TestTurnOf checks the upstream's lean reading of a request against a
// whole decode, on bodies in the gateway's encoding and on others; the
// lean reading must take the bodies in the gateway's encoding itself (a
// fast path that never matched would otherwise pass unseen).
func TestTurnOf(t *testing.T) {
	for _, tc := range []struct {
		name, body, key string
		tools           int
		wantLean        bool // the lean reading takes it
	}{
		{"first step", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"load 1 turn 0"}],"stream":true}`, `"load 1 turn 0"`, 0, true},
		{"third step", `{"model":"m","messages":[{"role":"user","content":"load 1 turn 0"},{"role":"assistant","content":"Step.","tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{}"}}]},{"role":"tool","content":"x","tool_call_id":"c1"},{"role":"assistant","content":null},{"role":"tool","content":"y","tool_call_id":"c2"}],"tools":[{"type":"function","function":{"name":"read"}}]}`, `"load 1 turn 0"`, 2, true},
		{"second turn", `{"messages":[{"role":"user","content":"load 1 turn 0"},{"role":"tool","content":"x"},{"role":"user","content":"load 1 turn 1"},{"role":"tool","content":"y"}]}`, `"load 1 turn 1"`, 1, true},
		{"content parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"load 2 turn 0"}]}]}`, `[{"type":"text","text":"load 2 turn 0"}]`, 0, true},
		{"markers inside strings", `{"messages":[{"role":"user","content":"say {\"role\":\"tool\", and {\"role\":\"user\",\"content\":\"no\"}"},{"role":"tool","content":"{\"role\":\"tool\","}]}`, `"say {\"role\":\"tool\", and {\"role\":\"user\",\"content\":\"no\"}"`, 1, true},
		{"other member order", `{"messages":[{"content":"load 3 turn 0","role":"user"},{"role":"tool","content":"x"}]}`, `"load 3 turn 0"`, 1, false},
		{"spaced", `{"messages": [{"role": "user", "content": "load 4 turn 0"}]}`, `"load 4 turn 0"`, 0, false},
		{"no user message", `{"messages":[{"role":"system","content":"s"}]}`, "", 0, false},
		{"not JSON", `nope`, "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if lk, lt, ok := turnOfLean([]byte(tc.body)); ok != tc.wantLean {
				t.Fatalf("turnOfLean = %q, %d, ok %v; want ok %v", lk, lt, ok, tc.wantLean)
			}
			key, tools := turnOf([]byte(tc.body))
			if key != tc.key || tools != tc.tools {
				t.Fatalf("turnOf = %q, %d; want %q, %d", key, tools, tc.key, tc.tools)
			}
			if fk, ft := turnOfDecoded([]byte(tc.body)); fk != key || ft != tools {
				t.Fatalf("turnOf = %q, %d; the whole decode reads %q, %d", key, tools, fk, ft)
			}
		})
	}
}

// BenchmarkTurnOf reads a 5-step request of about the load's size (a
// long system prompt, five calls and results, a tool list) both ways.
func BenchmarkTurnOf(b *testing.B) {
	var body bytes.Buffer
	body.WriteString(`{"model":"load","messages":[{"role":"system","content":` + jsonString(strings.Repeat("You are a coding agent. ", 400)) + `},{"role":"user","content":"load 7 turn 1"}`)
	for i := range 5 {
		fmt.Fprintf(&body, `,{"role":"assistant","content":"Step.","tool_calls":[{"id":"call_%d","type":"function","function":{"name":"read","arguments":"{\"file_path\":\"notes.txt\"}"}}]},{"role":"tool","content":%s,"tool_call_id":"call_%d"}`, i, jsonString(strings.Repeat("line of the notes file\n", 60)), i)
	}
	body.WriteString(`],"tools":[`)
	for i := range 17 {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"type":"function","function":{"name":"tool%d","description":%s,"parameters":{"type":"object","properties":{"file_path":{"type":"string"}}}}}`, i, jsonString(strings.Repeat("Reads a file. ", 20)))
	}
	body.WriteString(`],"stream":true}`)
	for _, bc := range []struct {
		name string
		fn   func([]byte) (string, int)
	}{{"lean", turnOf}, {"decoded", turnOfDecoded}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(body.Len()))
			for b.Loop() {
				if key, tools := bc.fn(body.Bytes()); key != `"load 7 turn 1"` || tools != 5 {
					b.Fatalf("read %q, %d", key, tools)
				}
			}
		})
	}
}

func jsonString(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}

// TestLatency: without jitter every answer takes the delay; with it, the
// latencies stay within delay ± jitter and are not all the same.
func TestLatency(t *testing.T) {
	tests := []struct {
		delay, jitter, lo, hi time.Duration
	}{
		{time.Second, 0, time.Second, time.Second},
		{time.Second, 500 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond},
		{100 * time.Millisecond, time.Second, 0, 200 * time.Millisecond}, // jitter capped at the delay
	}
	for _, tc := range tests {
		u := newUpstream(tc.delay, tc.jitter, 1, "read")
		seen := map[time.Duration]bool{}
		for range 200 {
			d := u.latency()
			if d < tc.lo || d > tc.hi {
				t.Fatalf("delay %v jitter %v: latency %v outside [%v, %v]", tc.delay, tc.jitter, d, tc.lo, tc.hi)
			}
			seen[d] = true
		}
		if spread := tc.lo != tc.hi; spread != (len(seen) > 1) {
			t.Errorf("delay %v jitter %v: %d distinct latencies in 200", tc.delay, tc.jitter, len(seen))
		}
	}
}
