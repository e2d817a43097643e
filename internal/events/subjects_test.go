package events_test

import (
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/events"
)

func TestSubjects(t *testing.T) {
	t.Parallel()
	tests := []struct{ tenant, id, events, status string }{
		{"", "0194f-abc_DEF", "dsh.events.default.0194f-abc_DEF", "dsh.status.default.0194f-abc_DEF"},
		{"default", "s", "dsh.events.default.s", "dsh.status.default.s"},
		{"acme", "a.b", "dsh.events.acme.a%2Eb", "dsh.status.acme.a%2Eb"},
		{"x*>% y", "x*>% y", "dsh.events.x%2A%3E%25%20y.x%2A%3E%25%20y", "dsh.status.x%2A%3E%25%20y.x%2A%3E%25%20y"},
		// A tenant cannot widen or split a subject: "acme.>" is one token.
		{"acme.>", "s", "dsh.events.acme%2E%3E.s", "dsh.status.acme%2E%3E.s"},
		{"acme", "", "dsh.events.acme.%", "dsh.status.acme.%"},
	}
	for _, tt := range tests {
		if got := events.EventSubject(tt.tenant, tt.id); got != tt.events {
			t.Errorf("EventSubject(%q, %q) = %q, want %q", tt.tenant, tt.id, got, tt.events)
		}
		if got := events.StatusSubject(tt.tenant, tt.id); got != tt.status {
			t.Errorf("StatusSubject(%q, %q) = %q, want %q", tt.tenant, tt.id, got, tt.status)
		}
	}
	for _, tt := range []struct{ got, want string }{
		{events.TenantEvents("acme"), "dsh.events.acme.>"},
		{events.TenantStatus(""), "dsh.status.default.>"},
		{events.SessionEvents("a.b"), "dsh.events.*.a%2Eb"},
		{events.SessionStatus("s"), "dsh.status.*.s"},
		{events.TenantInboxPrefix("a b"), "_INBOX_a%20b"},
		{events.MsgID("s", 42), "s:42"},
		{events.AllEvents, "dsh.events.>"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

// FuzzTenantSubjects checks that no tenant and session id can produce a
// subject that is not exactly four tokens, or that another tenant's
// consumer filter (dsh.events.<other>.>) matches.
func FuzzTenantSubjects(f *testing.F) {
	for _, s := range [][2]string{{"", "s"}, {"acme", "a.b"}, {"a.>", "*"}, {"default", ""}, {"%", "%2E"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, tenant, id string) {
		subj := events.EventSubject(tenant, id)
		toks := strings.Split(subj, ".")
		if len(toks) != 4 || toks[0] != "dsh" || toks[1] != "events" || toks[2] != events.TenantToken(tenant) {
			t.Fatalf("EventSubject(%q, %q) = %q is not dsh.events.<tenant>.<id>", tenant, id, subj)
		}
		back, err := events.DecodeSubjectToken(toks[2])
		if tenant == "" {
			tenant = events.DefaultTenant
		}
		if err != nil || back != tenant {
			t.Fatalf("tenant token %q decodes to %q, %v; want %q", toks[2], back, err, tenant)
		}
	})
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
