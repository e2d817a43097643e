// Package stackgrow grows the calling goroutine's stack in one step.
//
// A goroutine starts with a small stack and the runtime doubles it when a
// call does not fit, each time copying every frame the stack holds and
// adjusting their pointers (runtime.copystack). A goroutine that is made
// per unit of work (the agent's driver per turn, a gRPC stream's handler)
// and then runs deep code — the protobuf decoder's recursion, gRPC's stream
// set-up — doubled its stack two or three times deep in that code, with
// dozens of frames to copy each time: 3–12 % of a service's CPU in the
// profiles of docs/arch/throughput.md §20 and §22. Calling To16KiB while the stack is
// still shallow grows it once, with a frame or two to copy.
package stackgrow

// frame is To16KiB's frame: with what a shallow caller already uses, the
// runtime grows the stack to the next power of two that holds it, 16 KiB.
// A larger frame (a 32 KiB stack) cost more in the gateway's profile: the
// collector halves idle stacks more often and the frame is zeroed.
const frame = 8 << 10

// To16KiB grows the calling goroutine's stack to 16 KiB (if it is smaller)
// in one copy. Call it first thing in a goroutine that will run deep code.
func To16KiB() { grow(0) }

// grow has a frame of frame bytes; i only keeps the compiler from dropping
// the array.
//
//go:noinline
func grow(i int) byte {
	var pad [frame]byte
	return pad[i]
}
