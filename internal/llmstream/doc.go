// Package llmstream folds the raw StreamChunk protocol (semantics.md §2.2–§2.4)
// into content blocks, and checks streams against the protocol's grammar.
//
// [Assembler] is the single shared fold used by the agent loop and by
// anything else that turns a stream into an assistant message. It is lenient:
// it tolerates delta-only streams with no block-start or block-end, ignores
// stragglers after a block closed, and lets the first block-end win.
//
// [GrammarChecker] and [CheckStream] are strict: they enforce the adapter
// contract's stream grammar and are meant for adapter tests and as a debug
// check around every stream.
//
// # Ordering
//
// Blocks are returned in the order their index was first seen, whatever the
// indices' numeric order.
package llmstream
