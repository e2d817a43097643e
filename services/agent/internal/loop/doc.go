// Package loop is the per-session driver of the agent service: one Agent per
// live session owns its session.Log, the two inbox FIFOs (queued sends and
// steering), and one driver goroutine that runs turns (runTurn) made of steps
// (runStep) and tool batches, exactly in the order of semantics.md §4.5–4.10.
// The package is transport-free: it reaches the model through the LLM seam,
// tools through the Tools seam, and durability through Config.Flush.
//
// # Ordering
//
// Every event is appended to the in-memory log synchronously, in the order of
// §4.6/§4.7: turn/start, the claimed user/message (after agent/prompt-submit),
// then per step: steering drained, agent/pre-step contexts, step/start,
// request/header (initial/resume on an instance's first request, change when
// the canonical header differs), every assistant/chunk, assistant/message,
// then the batch — each tool/call appended before its pre-execute stage,
// results committed in model order while parallel-safe bodies overlap,
// deferred contexts after all results — then steering, agent/post-step
// contexts and step/end; finally turn/end with the precedence disposed >
// aborted > error > max-tokens > completed.
//
// # Delivery
//
// Config.Flush is the durability checkpoint. The loop awaits it after every
// turn/end (before the next send is claimed), before each model request is
// dispatched (step/start and request/header are then durable), and before
// each tool body runs (tool/call is durable before any side effect). A failed
// pre-request or pre-tool checkpoint fails closed: the request is not sent, the
// body does not run. Record (settings changes: session/model, approval/policy,
// sandbox/mode, session/title) appends into the open turn, or as a zero-step
// turn when idle, and flushes before it returns; a session/model newer than
// the last request/header switches the route of the next step.
//
// # Shutdown
//
// Dispose aborts the active turn with the disposed cause (its turn/end says
// disposed), waits for the driver to exit and for pending idle-injection
// flushes, and reports the queued sends that never ran.
package loop
