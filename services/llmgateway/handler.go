package llmgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/stackgrow"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// MaxRequestBytes bounds one GenerateRequest on the wire. A request is a
// whole conversation (tool outputs, inline images), so gRPC's 4 MiB default
// is too small for long sessions.
const MaxRequestBytes = 64 << 20

// ServerOptions are the gRPC server options the gateway needs; pass them
// in grpcserver.Config.Options wherever the gateway is served (the binary
// does). A pool of stream workers serves each new stream on a parked
// goroutine instead of a new one (a busy pool still spawns): one fewer
// goroutine start in front of every first chunk, and a worker keeps the
// stack it grew decoding a request (a whole conversation: the protobuf
// decoder's recursion grew every new goroutine's stack, copystack was 5–8 %
// of the gateway's CPU under load). The pool is sized for the streams a
// gateway serves at once under load (each waits on its provider for
// seconds), not for the cores.
//
// Every stream's goroutine first grows its stack in one step, at the
// interceptor's shallow depth (presizeStream), instead of doubling it
// several times deep inside the request's decode.
func ServerOptions() []grpc.ServerOption { return ServerOptionsFor(streamWorkers) }

// ServerOptionsFor is ServerOptions with a pool of at least workers
// parked stream goroutines (never fewer than GOMAXPROCS), for a gateway
// that serves few streams at once: `dsh dev` serves one person's sessions,
// and starting 256 goroutines (each a stack to allocate, and later to scan)
// was ~3 % of its CPU up to the first model request, on the path of every
// launch (docs/arch/throughput.md §28). A stream that finds every worker
// busy runs on a new goroutine, as without a pool.
func ServerOptionsFor(workers int) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRequestBytes), grpc.NumStreamWorkers(uint32(max(runtime.GOMAXPROCS(0), workers))),
		grpc.ChainStreamInterceptor(presizeStream)}
}

// presizeStream grows the stream goroutine's stack to what serving a
// Generate needs before the handler decodes the request. A goroutine's
// stack starts at 2 KiB and doubles when a call does not fit, each time
// copying the whole stack and adjusting every frame on it; a stream grew
// it up to three times, mostly deep in the protobuf decoder's recursion
// over the request (runtime.copystack 5 % of the gateway's CPU with every
// stream on a pooled worker: the collector halves an idle worker's stack,
// and the pool hands the next stream to the worker idle longest; 12 % at
// 1,000 sessions, when streams past the pool run on new goroutines). One
// call with a large frame here grows it once, with a few frames to copy;
// a stack already that large only runs the call.
func presizeStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	stackgrow.To16KiB()
	return h(srv, ss)
}

// streamWorkers is the size of the stream worker pool: at most this many
// parked goroutines with their grown stacks (tens of KiB each).
const streamWorkers = 256

// Register registers the LlmGateway service on gs.
func (s *Service) Register(gs *grpc.Server) {
	llmv1.RegisterLlmGatewayServer(gs, handler{s: s})
}

// handler is the gRPC edge: validation, proto <-> domain, error mapping.
type handler struct {
	llmv1.UnimplementedLlmGatewayServer
	s *Service
}

var _ llmv1.LlmGatewayServer = handler{}

// Generate makes exactly one provider attempt and streams its chunks.
func (h handler) Generate(req *llmv1.GenerateRequest, stream grpc.ServerStreamingServer[llmv1.GenerateResponse]) error {
	ctx := stream.Context()
	prev, added, err := h.s.resolve(req)
	if err != nil {
		return toStatus(h.s.log, "Generate", err)
	}
	r, preq, err := h.s.prepare(req)
	if err != nil {
		return toStatus(h.s.log, "Generate", err)
	}
	// Remember the conversation (the request as received: replay state
	// stripped for this route by prepare stays in the remembered messages
	// for the next route to decide on) and name it in the header.
	md := metadata.MD{}
	if next := h.s.remember(req, prev, added); next != nil {
		md.Set(PrefixHeader, next.ID())
		ctx = provider.WithBodyCache(ctx, bodySlot{c: h.s.prefixes, prev: prev, next: next})
	} else if prev != nil {
		ctx = provider.WithBodyCache(ctx, bodySlot{c: h.s.prefixes, prev: prev})
	}
	req = preq
	// Send the response headers now, so they travel while the provider
	// works on its first token instead of in front of the first chunk
	// (measured: sending them with the first chunk instead was no faster
	// in process and slower out of process, see
	// docs/arch/throughput-gateway.md).
	if err := stream.SendHeader(md); err != nil {
		return toStatus(h.s.log, "Generate", err)
	}
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.SetAttributes(telemetry.ModelCallAttributes(req.GetSessionId(), r.name, req.GetModel())...)
	}
	start := time.Now()
	chunks := 0
	var outcome string
	// Chunks go out through out: one per response, or batched when the
	// client asked (batch_chunks) and the adapter marks boundaries.
	out := sender{send: stream.Send}
	gone := func(err error) error {
		h.s.log.Debug("generate: client went away", "route", r.name, "err", err)
		return toStatus(h.s.log, "Generate", err)
	}
	chunkSeq := h.s.stream
	if req.GetBatchChunks() {
		chunkSeq = h.s.streamMarked
	}
	for c := range chunkSeq(ctx, r, req) {
		if c == nil { // a boundary: the adapter is about to wait
			if err := out.boundary(); err != nil {
				return gone(err)
			}
			continue
		}
		chunks++
		if f := c.GetFinish(); f != nil {
			outcome = finishKind(f)
			if span.IsRecording() {
				span.SetAttributes(attribute.String("dsh.llm.outcome", outcome))
			}
		}
		if u := c.GetUsage(); u != nil && span.IsRecording() {
			span.SetAttributes(telemetry.UsageAttributes(u.GetUsage())...)
		}
		if err := out.chunk(c); err != nil {
			return gone(err)
		}
	}
	if err := out.flush(); err != nil {
		return gone(err)
	}
	h.s.log.Info("generate", "route", r.name, "model", req.GetModel(), "outcome", outcome, "chunks", chunks, "duration", time.Since(start))
	return nil
}

func finishKind(f *llmv1.FinishChunk) string {
	switch k := f.GetReason().GetKind().(type) {
	case *llmv1.FinishReason_Stop:
		return "stop"
	case *llmv1.FinishReason_ToolCalls:
		return "tool-calls"
	case *llmv1.FinishReason_MaxTokens:
		return "max-tokens"
	case *llmv1.FinishReason_Error:
		return "error:" + k.Error.GetFailure().GetCode()
	case *llmv1.FinishReason_Aborted:
		return "aborted"
	case *llmv1.FinishReason_Extension:
		return k.Extension.GetType()
	}
	return "?"
}

// ListProviders lists the registered routes in registration order.
func (h handler) ListProviders(context.Context, *llmv1.ListProvidersRequest) (*llmv1.ListProvidersResponse, error) {
	out := &llmv1.ListProvidersResponse{}
	for _, r := range h.s.routes {
		out.Providers = append(out.Providers, &llmv1.ProviderInfo{Id: r.name, Name: r.display, Kind: r.adapter.Kind()})
	}
	return out, nil
}

// ListModels lists a route's advisory catalogue.
// A route configured without a catalogue (an OpenAI-compatible server with
// only a base URL) asks its server; when that fails the answer is
// UNAVAILABLE saying so, never a silently empty list.
func (h handler) ListModels(ctx context.Context, req *llmv1.ListModelsRequest) (*llmv1.ListModelsResponse, error) {
	r, err := h.s.lookup(req.GetProvider())
	if err != nil {
		return nil, toStatus(h.s.log, "ListModels", err)
	}
	models := r.adapter.Models()
	if f, ok := r.adapter.(provider.ModelFetcher); ok && len(models) == 0 {
		if models, err = f.FetchModels(ctx); err != nil {
			return nil, status.Errorf(codes.Unavailable, "route %q has no configured model and its server did not list any: %v (set OPENAI_MODEL or the route's models in --config)", r.name, err)
		}
	}
	out := &llmv1.ListModelsResponse{}
	for _, m := range models {
		mi := &llmv1.ModelInfo{Provider: r.name, Id: m.ID, Name: m.Name, Description: m.Description}
		if mi.Name == "" {
			mi.Name = m.ID
		}
		if m.ContextWindow > 0 {
			mi.ContextWindow = proto.Int64(m.ContextWindow)
		}
		out.Models = append(out.Models, mi)
	}
	return out, nil
}

// GetModelContext returns a route and model's context window (none when
// unknown: never guessed) and the compaction policy configured for them.
func (h handler) GetModelContext(_ context.Context, req *llmv1.GetModelContextRequest) (*llmv1.GetModelContextResponse, error) {
	r, err := h.s.lookup(req.GetProvider())
	if err != nil {
		return nil, toStatus(h.s.log, "GetModelContext", err)
	}
	if req.GetModel() == "" {
		return nil, toStatus(h.s.log, "GetModelContext", &provider.RequestError{Field: "model", Reason: "a model id is required"})
	}
	return &llmv1.GetModelContextResponse{Context: r.modelContext(req.GetModel())}, nil
}

func (s *Service) lookup(name string) (*route, error) {
	if name == "" {
		return nil, &provider.RequestError{Field: "provider", Reason: fmt.Sprintf("a provider route is required (registered: %v)", s.RouteNames())}
	}
	r, ok := s.byName[name]
	if !ok {
		return nil, &UnknownRouteError{Route: name, Registered: s.RouteNames()}
	}
	return r, nil
}

// prepare validates req and strips replay state the target adapter does not
// own (§2.3 rule 8: replay state passes only when the historical route and
// the target route are served by the very same adapter instance). It never
// mutates req.
func (s *Service) prepare(req *llmv1.GenerateRequest) (*route, *llmv1.GenerateRequest, error) {
	r, err := s.lookup(req.GetProvider())
	if err != nil {
		return nil, nil, err
	}
	if req.GetModel() == "" {
		return nil, nil, &provider.RequestError{Field: "model", Reason: "a model id is required"}
	}
	if len(req.GetMessages()) == 0 {
		return nil, nil, &provider.RequestError{Field: "messages", Reason: "at least one message is required"}
	}
	for i, m := range req.GetMessages() {
		if m.GetRole() == llmv1.Role_ROLE_UNSPECIFIED {
			return nil, nil, &provider.RequestError{Field: fmt.Sprintf("messages[%d].role", i), Reason: "a role is required"}
		}
	}
	// A request naming a remembered conversation's tools (same_tools, put
	// there by resolve) has them validated already: they were remembered
	// only after passing these checks.
	tools := req.GetTools()
	if req.GetPrefix().GetSameTools() {
		tools = nil
	}
	for i, t := range tools {
		if t.GetName() == "" {
			return nil, nil, &provider.RequestError{Field: fmt.Sprintf("tools[%d].name", i), Reason: "a tool name is required"}
		}
		if p := t.GetParameters(); p != "" && !s.isJSONObject(p) {
			return nil, nil, &provider.RequestError{Field: fmt.Sprintf("tools[%d].parameters", i), Reason: "must be a JSON Schema object as JSON text"}
		}
	}
	if err := r.adapter.Validate(req); err != nil {
		return nil, nil, err
	}
	var cloned bool
	for i, m := range req.GetMessages() {
		pv := m.GetProvenance()
		if pv == nil || pv.ReplayState == nil {
			continue
		}
		if owner, ok := s.byName[pv.GetProvider()]; ok && owner.adapter == r.adapter {
			continue
		}
		if !cloned {
			// The tools stay the caller's (prepare never changes them):
			// a remembered conversation recognises its own tool objects
			// by identity and writes their kept bytes (chat's SameTools).
			tools := req.Tools
			req = proto.CloneOf(req)
			req.Tools = tools
			cloned = true
		}
		req.Messages[i].Provenance.ReplayState = nil
	}
	return r, req, nil
}

// isJSONObject reports whether s is a JSON object (or null) as JSON text.
// Tool schemas repeat on every request of a conversation, so the answer
// for the ones accepted is remembered (validating them was 12 % of the
// gateway's CPU at 1,000 sessions, see docs/arch/throughput-gateway.md).
func (s *Service) isJSONObject(p string) bool {
	_, err := s.objects.Get(p)
	return err == nil
}

// errNotObject: the text is not a JSON object.
var errNotObject = errors.New("not a JSON object")

// jsonObject accepts exactly what unmarshalling into a
// map[string]json.RawMessage accepts: valid JSON whose value is an object
// or null (FuzzJSONObject holds it to that).
func jsonObject(p string) (struct{}, error) {
	b := []byte(p)
	if !json.Valid(b) {
		return struct{}{}, errNotObject
	}
	// Valid JSON (so not blank) starting with '{' is an object, with 'n'
	// it is null.
	if t := bytes.TrimLeft(b, " \t\r\n"); t[0] == '{' || t[0] == 'n' {
		return struct{}{}, nil
	}
	return struct{}{}, errNotObject
}
