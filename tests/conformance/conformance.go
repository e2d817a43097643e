// Package conformance is the cross-language conformance suite of dsh
// toolhosts: one Go test harness that dials any host over gRPC and checks the
// dsh.tools.v1.ToolHost contract — listing, schema shape, argument
// validation, unknown tools, throwing tools, cancellation, streamed output,
// presentation views, concurrent calls, WatchTools and GetWorkspaceContext.
// Every Execute stream is classified by internal/toolstream, so a malformed
// one fails the suite as TOOL_HOST_PROTOCOL_ERROR.
//
// # The conformance tools
//
// A host under test serves these tools (the Python, TypeScript and Go example
// hosts and the MCP bridge's test server all do). Names may carry a prefix
// (Options.Prefix), e.g. "conf__conf_echo" behind the MCP bridge.
//
//	conf_echo     {text: string required, mode?: "plain"|"upper", tags?: string[],
//	               opts?: {flag: boolean required}}; concurrency ALWAYS.
//	              Returns text (upper-cased when mode is "upper"), meta
//	              {"length": <code points of text>}. Call view: generic
//	              {title "echo <text>", kind OTHER, raw_input <text>}; result
//	              view: generic {title "echoed <text>"}.
//	conf_fail     {message: string required}: throws a plain error with
//	              message → "Error: <message>".
//	conf_slow     {key: string required, ms?: integer (default 60000)}: records
//	              key as "running", emits output "started <key>", waits ms or
//	              until cancelled and records "completed" or "cancelled".
//	conf_status   {key: string required}: "running" | "completed" |
//	              "cancelled" | "unknown" for that key; concurrency ALWAYS.
//	conf_stream   {count: integer required}: emits outputs "chunk 1\n" ..
//	              "chunk <count>\n" on stream "stdout", returns
//	              "streamed <count>". Call view: terminal {title
//	              "stream <count>", description "streams chunks"}; result view:
//	              terminal {output: the chunks joined, exit_code 0}.
//	conf_barrier  {key: string required, n: integer required}: returns
//	              "released <key>" once n calls with key are running at once;
//	              fails after 10 s otherwise. Concurrency ALWAYS.
//	conf_add_tool {name: string required}: adds a tool <name> (no
//	              parameters) returning "dynamic <name>"; returns
//	              "added <name>".
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/toolstream"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/descriptorpb"
)

// ToolNames are the conformance tools every host must serve (unprefixed).
var ToolNames = []string{"conf_echo", "conf_fail", "conf_slow", "conf_status", "conf_stream", "conf_barrier", "conf_add_tool"}

// Options adapt the suite to a kind of host.
type Options struct {
	// Prefix is prepended to every conformance tool name.
	Prefix string
	// Raw says the host serves the tools as raw JSON-Schema tools that
	// validate their own input (bridges): validation failures are checked as
	// "Error: ..." error results without exact messages, and no presentation
	// views or meta are expected.
	Raw bool
	// OutputStream is the stream name of live output; "stdout" when empty.
	OutputStream string
	// Context is sent with every call; a temporary directory when nil.
	Context *toolsv1.ToolContext
}

type suite struct {
	opts   Options
	client toolsv1.ToolHostClient
	conn   *grpc.ClientConn
}

// Run runs the suite against the host dial connects to. It dials once and
// shares the connection between parallel subtests.
func Run(t *testing.T, dial func() (*grpc.ClientConn, error), opts Options) {
	t.Helper()
	conn, err := dial()
	if err != nil {
		t.Fatalf("dial host: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	if opts.OutputStream == "" {
		opts.OutputStream = "stdout"
	}
	if opts.Context == nil {
		dir := t.TempDir()
		opts.Context = &toolsv1.ToolContext{SessionId: "conformance", Cwd: dir, WorkspaceRoot: dir, Turn: 1, Step: 1}
	}
	s := &suite{opts: opts, client: toolsv1.NewToolHostClient(conn), conn: conn}
	t.Run("Health", s.health)
	t.Run("Listing", s.listing)
	t.Run("Reflection", s.reflection)
	t.Run("Group", func(t *testing.T) {
		t.Run("Success", s.success)
		t.Run("Validation", s.validation)
		t.Run("UnknownTool", s.unknownTool)
		t.Run("Throws", s.throws)
		t.Run("CancelSlow", s.cancelSlow)
		t.Run("Stream", s.stream)
		t.Run("Views", s.views)
		t.Run("Concurrent", s.concurrent)
		t.Run("WatchAfterAdd", s.watchAfterAdd)
		t.Run("WorkspaceContext", s.workspaceContext)
	})
}

func (s *suite) name(n string) string { return s.opts.Prefix + n }

func (s *suite) exec(id, name, args string) *toolsv1.ToolExecution {
	return &toolsv1.ToolExecution{CallId: id, Name: name, Arguments: args, Context: s.opts.Context}
}

// call runs one call and checks the stream against the protocol.
func (s *suite) call(t *testing.T, name, args string) (*toolsv1.ToolExecutionResult, []*toolsv1.ToolOutput) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := s.client.Execute(ctx, &toolsv1.ExecuteRequest{Execution: s.exec("call-"+name, name, args)})
	if err != nil {
		t.Fatalf("Execute(%s): %v", name, err)
	}
	res, outs, err := toolstream.Collect(stream)
	if err != nil {
		t.Fatalf("Execute(%s, %s): %v", name, args, err)
	}
	return res, outs
}

func text(blocks []*llmv1.ContentBlock) string {
	var b strings.Builder
	for _, c := range blocks {
		b.WriteString(c.GetText().GetText())
	}
	return b.String()
}

func (s *suite) health(t *testing.T) {
	t.Parallel()
	resp, err := healthpb.NewHealthClient(s.conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health Check: %v", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, want SERVING", resp.GetStatus())
	}
}

// reflection checks server reflection as grpcurl uses it: the services are
// listed, and the ToolHost service resolves from the descriptors the host
// sends (with their imports) into a working description of Execute; an
// unknown symbol is NOT_FOUND in the stream.
func (s *suite) reflection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(s.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatalf("reflection send: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection recv: %v", err)
		}
		return resp
	}
	list := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	var names []string
	for _, svc := range list.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	for _, want := range []string{"dsh.tools.v1.ToolHost", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
	files := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "dsh.tools.v1.ToolHost"}}).GetFileDescriptorResponse().GetFileDescriptorProto()
	set := &descriptorpb.FileDescriptorSet{}
	for _, b := range files {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatalf("reflection sent a file descriptor that does not decode: %v", err)
		}
		set.File = append(set.File, fd)
	}
	// Imports the host did not send (well-known types) come from the global registry.
	reg, err := protodesc.NewFiles(withKnownImports(set))
	if err != nil {
		t.Fatalf("the descriptors reflection sent for dsh.tools.v1.ToolHost do not resolve: %v", err)
	}
	d, err := reg.FindDescriptorByName("dsh.tools.v1.ToolHost")
	if err != nil {
		t.Fatalf("resolved descriptors lack the service: %v", err)
	}
	m := d.(protoreflect.ServiceDescriptor).Methods().ByName("Execute")
	if m == nil || m.Input().FullName() != "dsh.tools.v1.ExecuteRequest" || !m.IsStreamingServer() {
		t.Errorf("Execute via reflection = %v, want a server-streaming method taking dsh.tools.v1.ExecuteRequest", m)
	}
	bad := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "dsh.nope.v1.Nothing"}})
	if got := codes.Code(bad.GetErrorResponse().GetErrorCode()); got != codes.NotFound {
		t.Errorf("unknown symbol: error code %v (%q), want NotFound", got, bad.GetErrorResponse().GetErrorMessage())
	}
}

// withKnownImports adds the files set imports but does not carry (they are
// in the global registry, e.g. google/protobuf/*.proto).
func withKnownImports(set *descriptorpb.FileDescriptorSet) *descriptorpb.FileDescriptorSet {
	have := map[string]bool{}
	for _, f := range set.GetFile() {
		have[f.GetName()] = true
	}
	for i := 0; i < len(set.File); i++ {
		for _, dep := range set.File[i].GetDependency() {
			if have[dep] {
				continue
			}
			if fd, err := protoregistry.GlobalFiles.FindFileByPath(dep); err == nil {
				have[dep] = true
				set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
			}
		}
	}
	return set
}

func (s *suite) listing(t *testing.T) {
	resp, err := s.client.ListTools(t.Context(), &toolsv1.ListToolsRequest{})
	if err != nil {
		t.Fatalf("ListTools: %v", err)
	}
	if resp.GetRevision() <= 0 {
		t.Errorf("revision = %d, want > 0", resp.GetRevision())
	}
	byName := map[string]*toolsv1.ToolDescriptor{}
	for _, d := range resp.GetTools() {
		n := d.GetSchema().GetName()
		if _, dup := byName[n]; dup {
			t.Errorf("tool %q listed twice", n)
		}
		byName[n] = d
		var params map[string]any
		if err := json.Unmarshal([]byte(d.GetSchema().GetParameters()), &params); err != nil {
			t.Errorf("%s: parameters are not a JSON object: %v", n, err)
			continue
		}
		if params["type"] != "object" {
			t.Errorf("%s: parameters type = %v, want object", n, params["type"])
		}
	}
	for _, n := range ToolNames {
		d, ok := byName[s.name(n)]
		if !ok {
			t.Errorf("tool %q not listed (have %v)", s.name(n), keys(byName))
			continue
		}
		if d.GetSchema().GetDescription() == "" {
			t.Errorf("%s: empty description", s.name(n))
		}
		if d.GetValidatesArguments() == s.opts.Raw {
			t.Errorf("%s: validates_arguments = %v, want %v", s.name(n), d.GetValidatesArguments(), !s.opts.Raw)
		}
	}
	echo := byName[s.name("conf_echo")]
	if echo == nil {
		t.FailNow()
	}
	if got := echo.GetConcurrency(); got != toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS {
		t.Errorf("conf_echo concurrency = %v, want ALWAYS", got)
	}
	if got := byName[s.name("conf_slow")].GetConcurrency(); got == toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS {
		t.Errorf("conf_slow concurrency = %v, want not ALWAYS", got)
	}
	var p struct {
		Type       string `json:"type"`
		Required   []string
		Properties map[string]struct {
			Type       string `json:"type"`
			Enum       []string
			Items      *struct{ Type string }
			Required   []string
			Properties map[string]struct{ Type string }
		}
	}
	if err := json.Unmarshal([]byte(echo.GetSchema().GetParameters()), &p); err != nil {
		t.Fatalf("conf_echo parameters: %v", err)
	}
	if diff := cmp.Diff([]string{"text"}, p.Required); diff != "" {
		t.Errorf("conf_echo required (-want +got):\n%s", diff)
	}
	pr := p.Properties
	checks := []struct {
		what      string
		got, want any
	}{
		{"text.type", pr["text"].Type, "string"},
		{"mode.type", pr["mode"].Type, "string"},
		{"mode.enum", pr["mode"].Enum, []string{"plain", "upper"}},
		{"tags.type", pr["tags"].Type, "array"},
		{"tags.items.type", func() string {
			if pr["tags"].Items == nil {
				return ""
			}
			return pr["tags"].Items.Type
		}(), "string"},
		{"opts.type", pr["opts"].Type, "object"},
		{"opts.required", pr["opts"].Required, []string{"flag"}},
		{"opts.properties.flag.type", pr["opts"].Properties["flag"].Type, "boolean"},
	}
	for _, c := range checks {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("conf_echo schema %s (-want +got):\n%s", c.what, diff)
		}
	}

	// WatchTools opens with the same snapshot.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := s.client.WatchTools(ctx, &toolsv1.WatchToolsRequest{})
	if err != nil {
		t.Fatalf("WatchTools: %v", err)
	}
	first, err := w.Recv()
	if err != nil {
		t.Fatalf("WatchTools first snapshot: %v", err)
	}
	if first.GetRevision() < resp.GetRevision() {
		t.Errorf("watch revision %d < list revision %d", first.GetRevision(), resp.GetRevision())
	}
	for _, n := range ToolNames {
		if !slices.ContainsFunc(first.GetTools(), func(d *toolsv1.ToolDescriptor) bool { return d.GetSchema().GetName() == s.name(n) }) {
			t.Errorf("first watch snapshot lacks %s", s.name(n))
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (s *suite) success(t *testing.T) {
	t.Parallel()
	res, outs := s.call(t, s.name("conf_echo"), `{"text":"héllo","mode":"upper","zzz":"extra keys are allowed"}`)
	if res.GetIsError() || text(res.GetContent()) != "HÉLLO" {
		t.Fatalf("conf_echo = %q (is_error %v), want HÉLLO", text(res.GetContent()), res.GetIsError())
	}
	if len(outs) != 0 {
		t.Errorf("conf_echo emitted %d outputs, want 0", len(outs))
	}
	if res.GetError() != nil {
		t.Errorf("success carries error %v", res.GetError())
	}
	if !s.opts.Raw {
		var meta map[string]any
		if err := json.Unmarshal([]byte(res.GetMeta()), &meta); err != nil || meta["length"] != float64(5) {
			t.Errorf("conf_echo meta = %q, want {\"length\":5}", res.GetMeta())
		}
	}
}

func (s *suite) validation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, args, want string
	}{
		{"missing required", `{}`, `missing required property "text"`},
		{"wrong type", `{"text":1}`, `"text" must be a string`},
		{"bad enum", `{"text":"a","mode":"loud"}`, `"mode" must be one of [plain, upper]`},
		{"array item", `{"text":"a","tags":["x",2]}`, `"tags[1]" must be a string`},
		{"nested required", `{"text":"a","opts":{}}`, `missing required property "opts.flag"`},
		{"every violation in order", `{"mode":"x","opts":{"flag":"no"}}`,
			`missing required property "text"; "mode" must be one of [plain, upper]; "opts.flag" must be a boolean`},
		{"not an object", `[1,2]`, `"arguments" must be an object`},
		// Invalid JSON: one message shape on every host (Go's
		// encoding/json syntax errors; see sdk/python/dsh_toolhost/jsonsyntax.py).
		{"not JSON", `{"text":`, `arguments are not valid JSON: unexpected end of JSON input`},
		{"empty text is not JSON", ``, `arguments are not valid JSON: unexpected end of JSON input`},
		{"blank text is not JSON", " \n\t", `arguments are not valid JSON: unexpected end of JSON input`},
		{"bare word", `not json`, `arguments are not valid JSON: invalid character 'o' in literal null (expecting 'u')`},
		{"trailing data", `{"text":"a"} x`, `arguments are not valid JSON: unexpected data after the JSON value`},
		{"two values", `{} {}`, `arguments are not valid JSON: unexpected data after the JSON value`},
		{"missing colon", `{"text" "a"}`, `arguments are not valid JSON: invalid character '"' after object key`},
		{"trailing comma", `{"text":"a",}`, `arguments are not valid JSON: invalid character '}' looking for beginning of object key string`},
		{"single quotes", `{'text':'a'}`, `arguments are not valid JSON: invalid character '\'' looking for beginning of object key string`},
		{"missing comma", `{"text":"a" "mode":"plain"}`, `arguments are not valid JSON: invalid character '"' after object key:value pair`},
		{"array element", `{"text":"a","tags":["x" "y"]}`, `arguments are not valid JSON: invalid character '"' after array element`},
		{"array trailing comma", `{"text":"a","tags":["x",]}`, `arguments are not valid JSON: invalid character ']' looking for beginning of value`},
		{"NaN", `{"text":NaN}`, `arguments are not valid JSON: invalid character 'N' looking for beginning of value`},
		{"bad literal", `{"text":"a","opts":{"flag":tru}}`, `arguments are not valid JSON: invalid character '}' in literal true (expecting 'e')`},
		{"leading zero", `{"text":01}`, `arguments are not valid JSON: invalid character '1' after object key:value pair`},
		{"bad number", `{"text":-}`, `arguments are not valid JSON: invalid character '}' in numeric literal`},
		{"bad fraction", `{"text":1.}`, `arguments are not valid JSON: invalid character '}' after decimal point in numeric literal`},
		{"bad exponent", `{"text":1e}`, `arguments are not valid JSON: invalid character '}' in exponent of numeric literal`},
		{"bad escape", `{"text":"\q"}`, `arguments are not valid JSON: invalid character 'q' in string escape code`},
		{"bad unicode escape", `{"text":"\u12g4"}`, `arguments are not valid JSON: invalid character 'g' in \u hexadecimal character escape`},
		{"control character", "{\"text\":\"a\tb\"}", `arguments are not valid JSON: invalid character '\t' in string literal`},
		{"byte order mark", "\ufeff{}", `arguments are not valid JSON: invalid character 'ï' looking for beginning of value`},
		{"non-ASCII byte", `{"text":é}`, `arguments are not valid JSON: invalid character 'Ã' looking for beginning of value`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res, _ := s.call(t, s.name("conf_echo"), c.args)
			got := text(res.GetContent())
			if !res.GetIsError() {
				t.Fatalf("result is not an error: %q", got)
			}
			// Raw tools validate themselves, but JSON and objecthood are
			// checked by every host.
			if s.opts.Raw && !strings.HasPrefix(c.want, "arguments are not valid JSON") && c.args != `[1,2]` {
				if !strings.HasPrefix(got, "Error: ") {
					t.Errorf("text = %q, want an \"Error: \" message", got)
				}
				return
			}
			want := "Error: invalid arguments: " + c.want
			if got != want {
				t.Errorf("text:\n got %q\nwant %q", got, want)
			}
			if diff := cmp.Diff(&toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"}, res.GetError(), protocmp.Transform()); diff != "" {
				t.Errorf("error info (-want +got):\n%s", diff)
			}
		})
	}
}

func (s *suite) unknownTool(t *testing.T) {
	t.Parallel()
	n := s.name("conf_nope")
	res, _ := s.call(t, n, `{}`)
	if !res.GetIsError() || res.GetError().GetCode() != "UNKNOWN_TOOL" {
		t.Fatalf("unknown tool: is_error %v error %v", res.GetIsError(), res.GetError())
	}
	if got := text(res.GetContent()); !strings.HasPrefix(got, "Error: ") || !strings.Contains(got, n) {
		t.Errorf("text = %q, want \"Error: ...\" naming %s", got, n)
	}
}

func (s *suite) throws(t *testing.T) {
	t.Parallel()
	res, _ := s.call(t, s.name("conf_fail"), `{"message":"kaboom 42"}`)
	if !res.GetIsError() || text(res.GetContent()) != "Error: kaboom 42" {
		t.Fatalf("conf_fail = %q (is_error %v), want \"Error: kaboom 42\"", text(res.GetContent()), res.GetIsError())
	}
	// The host survives: the next call works.
	if res, _ := s.call(t, s.name("conf_echo"), `{"text":"still here"}`); text(res.GetContent()) != "still here" {
		t.Errorf("after a throw, conf_echo = %q", text(res.GetContent()))
	}
}

func (s *suite) status(t *testing.T, key string) string {
	res, _ := s.call(t, s.name("conf_status"), fmt.Sprintf(`{"key":%q}`, key))
	return text(res.GetContent())
}

func (s *suite) cancelSlow(t *testing.T) {
	t.Parallel()
	key := fmt.Sprintf("slow-%d", time.Now().UnixNano())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := s.client.Execute(ctx, &toolsv1.ExecuteRequest{Execution: s.exec("slow", s.name("conf_slow"), fmt.Sprintf(`{"key":%q}`, key))})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("first message: %v", err)
	}
	if got := first.GetOutput().GetText(); got != "started "+key {
		t.Fatalf("first message = %v, want output \"started %s\"", first, key)
	}
	if got := s.status(t, key); got != "running" {
		t.Errorf("status while running = %q", got)
	}
	cancel()
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("Recv after cancel = %v, want Canceled", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := s.status(t, key)
		if got == "cancelled" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tool never saw the cancellation: status %q", got)
		}
		time.Sleep(10 * time.Millisecond) // polling the host, not waiting for a fixed time
	}
}

func (s *suite) stream(t *testing.T) {
	t.Parallel()
	res, outs := s.call(t, s.name("conf_stream"), `{"count":5}`)
	var want []*toolsv1.ToolOutput
	for i := 1; i <= 5; i++ {
		want = append(want, &toolsv1.ToolOutput{Stream: s.opts.OutputStream, Text: fmt.Sprintf("chunk %d\n", i)})
	}
	if diff := cmp.Diff(want, outs, protocmp.Transform()); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
	if res.GetIsError() || text(res.GetContent()) != "streamed 5" {
		t.Errorf("result = %q (is_error %v)", text(res.GetContent()), res.GetIsError())
	}
}

func (s *suite) views(t *testing.T) {
	t.Parallel()
	resp, err := s.client.PrepareCalls(t.Context(), &toolsv1.PrepareCallsRequest{Executions: []*toolsv1.ToolExecution{
		s.exec("1", s.name("conf_echo"), `{"text":"hi"}`),
		s.exec("2", s.name("conf_echo"), `{}`),
		s.exec("3", s.name("conf_slow"), `{"key":"k"}`),
		s.exec("4", s.name("conf_nope"), `{}`),
		s.exec("5", s.name("conf_stream"), `{"count":2}`),
		s.exec("6", s.name("conf_echo"), `not json`),
	}})
	if err != nil {
		t.Fatalf("PrepareCalls: %v", err)
	}
	var ids []string
	for _, c := range resp.GetCalls() {
		ids = append(ids, c.GetCallId())
	}
	if diff := cmp.Diff([]string{"1", "2", "3", "4", "5", "6"}, ids); diff != "" {
		t.Fatalf("prepared call ids (-want +got):\n%s", diff)
	}
	c := resp.GetCalls()
	par, excl := toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL, toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE
	for i, want := range map[int]toolsv1.ExecutionMode{0: par, 2: excl, 3: excl, 4: excl} {
		if c[i].GetMode() != want {
			t.Errorf("call %s mode = %v, want %v", c[i].GetCallId(), c[i].GetMode(), want)
		}
	}
	for _, i := range []int{1, 3, 5} {
		if c[i].GetView() != nil {
			t.Errorf("call %s (invalid or unknown) has a view %v, want the generic fallback", c[i].GetCallId(), c[i].GetView())
		}
	}
	if s.opts.Raw {
		return
	}
	wantCall := map[int]*toolsv1.ToolCallView{
		0: {Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{Title: "echo hi", Kind: toolsv1.ToolCallKind_TOOL_CALL_KIND_OTHER, RawInput: "hi"}}},
		4: {Card: &toolsv1.ToolCallView_Terminal{Terminal: &toolsv1.TerminalCallView{Title: "stream 2", Description: "streams chunks"}}},
	}
	for i, want := range wantCall {
		if diff := cmp.Diff(want, c[i].GetView(), protocmp.Transform()); diff != "" {
			t.Errorf("call view of %s (-want +got):\n%s", c[i].GetCallId(), diff)
		}
	}
	res, _ := s.call(t, s.name("conf_echo"), `{"text":"hi"}`)
	want := &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: "echoed hi"}}}
	if diff := cmp.Diff(want, res.GetView(), protocmp.Transform()); diff != "" {
		t.Errorf("conf_echo result view (-want +got):\n%s", diff)
	}
	res, _ = s.call(t, s.name("conf_stream"), `{"count":2}`)
	zero := int32(0)
	wantT := &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Terminal{Terminal: &toolsv1.TerminalResultView{Output: "chunk 1\nchunk 2\n", ExitCode: &zero}}}
	if diff := cmp.Diff(wantT, res.GetView(), protocmp.Transform()); diff != "" {
		t.Errorf("conf_stream result view (-want +got):\n%s", diff)
	}
}

func (s *suite) concurrent(t *testing.T) {
	t.Parallel()
	const n = 4
	key := fmt.Sprintf("barrier-%d", time.Now().UnixNano())
	var wg sync.WaitGroup
	got := make([]string, n)
	for i := range n {
		wg.Go(func() {
			res, _ := s.call(t, s.name("conf_barrier"), fmt.Sprintf(`{"key":%q,"n":%d}`, key, n))
			got[i] = text(res.GetContent())
		})
	}
	echoes := make([]string, 16)
	for i := range echoes {
		wg.Go(func() {
			res, _ := s.call(t, s.name("conf_echo"), fmt.Sprintf(`{"text":"call %d"}`, i))
			echoes[i] = text(res.GetContent())
		})
	}
	wg.Wait()
	for i, g := range got {
		if g != "released "+key {
			t.Errorf("barrier call %d = %q; the host did not run %d calls at once", i, g, n)
		}
	}
	for i, g := range echoes {
		if want := fmt.Sprintf("call %d", i); g != want {
			t.Errorf("echo %d = %q, want %q (results crossed between calls)", i, g, want)
		}
	}
}

func (s *suite) watchAfterAdd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := s.client.WatchTools(ctx, &toolsv1.WatchToolsRequest{})
	if err != nil {
		t.Fatalf("WatchTools: %v", err)
	}
	first, err := w.Recv()
	if err != nil {
		t.Fatalf("first snapshot: %v", err)
	}
	dyn := fmt.Sprintf("conf_dyn_%d", time.Now().UnixNano()%1_000_000_000)
	res, _ := s.call(t, s.name("conf_add_tool"), fmt.Sprintf(`{"name":%q}`, dyn))
	if text(res.GetContent()) != "added "+dyn {
		t.Fatalf("conf_add_tool = %q", text(res.GetContent()))
	}
	has := func(ds []*toolsv1.ToolDescriptor) bool {
		return slices.ContainsFunc(ds, func(d *toolsv1.ToolDescriptor) bool { return d.GetSchema().GetName() == s.name(dyn) })
	}
	type recv struct {
		m   *toolsv1.WatchToolsResponse
		err error
	}
	ch := make(chan recv)
	go func() {
		for {
			m, err := w.Recv()
			select {
			case ch <- recv{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	timeout := time.After(15 * time.Second)
	for found := false; !found; {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("watch: %v", r.err)
			}
			if r.m.GetRevision() <= first.GetRevision() {
				t.Fatalf("snapshot revision %d did not grow past %d", r.m.GetRevision(), first.GetRevision())
			}
			found = has(r.m.GetTools())
		case <-timeout:
			t.Fatalf("no snapshot with %s within 15s", s.name(dyn))
		}
	}
	list, err := s.client.ListTools(t.Context(), &toolsv1.ListToolsRequest{})
	if err != nil || !has(list.GetTools()) {
		t.Fatalf("ListTools after add lacks %s (err %v)", s.name(dyn), err)
	}
	if res, _ := s.call(t, s.name(dyn), `{}`); text(res.GetContent()) != "dynamic "+dyn {
		t.Errorf("%s = %q, want %q", s.name(dyn), text(res.GetContent()), "dynamic "+dyn)
	}
}

// workspaceContext: every host answers GetWorkspaceContext; one that owns no
// workspace (every example host) answers an empty context, and a relative
// cwd is INVALID_ARGUMENT everywhere.
func (s *suite) workspaceContext(t *testing.T) {
	t.Parallel()
	resp, err := s.client.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: s.opts.Context.GetCwd()})
	if err != nil {
		t.Fatalf("GetWorkspaceContext: %v", err)
	}
	if !resp.GetOwnsWorkspace() {
		empty := &toolsv1.GetWorkspaceContextResponse{}
		if diff := cmp.Diff(empty, resp, protocmp.Transform()); diff != "" {
			t.Errorf("a host that owns no workspace answered (-want +got):\n%s", diff)
		}
	}
	for _, cwd := range []string{"", "relative/dir"} {
		_, err := s.client.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: cwd})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("GetWorkspaceContext(cwd %q) = %v, want INVALID_ARGUMENT", cwd, err)
		}
	}
}
