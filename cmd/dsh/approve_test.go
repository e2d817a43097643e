package main

import (
	"testing"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func TestParseAnswer(t *testing.T) {
	t.Parallel()
	opts := []*sessionv1.QuestionOption{{Label: "sqlite"}, {Label: "postgres"}, {Label: "mysql"}}
	single := &sessionv1.Question{Id: "db", Options: opts}
	multi := &sessionv1.Question{Id: "db", Options: opts, MultiSelect: true}
	free := &sessionv1.Question{Id: "name"}
	custom := func(s string) *sessionv1.QuestionAnswer { return &sessionv1.QuestionAnswer{Id: "db", Custom: &s} }
	tests := []struct {
		q    *sessionv1.Question
		line string
		want *sessionv1.QuestionAnswer
	}{
		{single, "2", &sessionv1.QuestionAnswer{Id: "db", Selected: []string{"postgres"}}},
		{single, "1,3", custom("1,3")}, // one option only: taken as text
		{multi, "1, 3", &sessionv1.QuestionAnswer{Id: "db", Selected: []string{"sqlite", "mysql"}}},
		{single, "4", custom("4")},
		{single, "whatever is fastest", custom("whatever is fastest")},
		{free, "dsh", func() *sessionv1.QuestionAnswer { s := "dsh"; return &sessionv1.QuestionAnswer{Id: "name", Custom: &s} }()},
	}
	for _, tc := range tests {
		if got := parseAnswer(tc.q, tc.line); !proto.Equal(got, tc.want) {
			t.Errorf("%q: %v, want %v", tc.line, got, tc.want)
		}
	}
}
