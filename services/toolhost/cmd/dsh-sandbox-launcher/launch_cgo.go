//go:build cgo

package main

// #cgo CFLAGS: -O2 -Wall -Wextra
// #cgo LDFLAGS: -static
import "C"

// firstStage says the C first stage (launch.c) is in this build: it serves
// a call from a constructor before the Go runtime starts.
const firstStage = "c"
