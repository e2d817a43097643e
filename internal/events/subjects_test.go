package events_test

import (
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/events"
)

func TestSubjects(t *testing.T) {
	t.Parallel()
	tests := []struct{ id, events, status string }{
		{"0194f-abc_DEF", "dsh.events.0194f-abc_DEF", "dsh.status.0194f-abc_DEF"},
		{"a.b", "dsh.events.a%2Eb", "dsh.status.a%2Eb"},
		{"x*>% y", "dsh.events.x%2A%3E%25%20y", "dsh.status.x%2A%3E%25%20y"},
		{"", "dsh.events.%", "dsh.status.%"},
	}
	for _, tt := range tests {
		if got := events.EventSubject(tt.id); got != tt.events {
			t.Errorf("EventSubject(%q) = %q, want %q", tt.id, got, tt.events)
		}
		if got := events.StatusSubject(tt.id); got != tt.status {
			t.Errorf("StatusSubject(%q) = %q, want %q", tt.id, got, tt.status)
		}
	}
	if got := events.MsgID("s", 42); got != "s:42" {
		t.Errorf("MsgID = %q", got)
	}
}

func FuzzSubjectToken(f *testing.F) {
	for _, s := range []string{"", "abc", "a.b", "%", "%2E", "é", "a b\tc", "*>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		tok := events.SubjectToken(id)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("SubjectToken(%q) = %q is not a single subject token", id, tok)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] < '!' || tok[i] > '~' {
				t.Fatalf("SubjectToken(%q) = %q has byte %#x", id, tok, tok[i])
			}
		}
		back, err := events.DecodeSubjectToken(tok)
		if err != nil || back != id {
			t.Fatalf("DecodeSubjectToken(SubjectToken(%q)) = %q, %v", id, back, err)
		}
	})
}
