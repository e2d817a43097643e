//go:build !cgo

package main

// firstStage says this build has no C first stage: the launcher package's
// init serves a call once the Go runtime has started.
const firstStage = "go"
