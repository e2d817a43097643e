package main

import (
	"errors"
	"strings"
	"testing"
)

func TestToolhostNotice(t *testing.T) {
	var b strings.Builder
	notice := toolhostNotice(&b)
	steps := []struct {
		up   bool
		want string
	}{
		{true, ""},
		{false, "dsh: toolhost builtin is down; its tools fail as unavailable until it is back: connection refused\n"},
		{false, ""},
		{true, "dsh: toolhost builtin is back\n"},
		{true, ""},
	}
	for i, s := range steps {
		b.Reset()
		var err error
		if !s.up {
			err = errors.New("connection refused")
		}
		notice("builtin", s.up, err)
		if b.String() != s.want {
			t.Errorf("step %d: %q, want %q", i, b.String(), s.want)
		}
	}
}
