package llmgateway

import (
	"encoding/json"
	"testing"
)

// oldIsJSONObject is the validation prepare used before the memo: the
// reference jsonObject must agree with.
func oldIsJSONObject(s string) bool {
	var v map[string]json.RawMessage
	return json.Unmarshal([]byte(s), &v) == nil
}

var jsonObjectCases = []string{
	`{}`, ` {"type":"object"} `, "\t{\"a\":[1,2,{\"b\":null}]}\n", `null`, ` null `,
	`[]`, `"s"`, `1`, `true`, ``, ` `, `{`, `{"a":}`, `{} {}`, `{}x`, `nul`, `nullx`,
	`{"a":"\u00e9","a":1}`, "{\"k\":\"\xff\"}", `{"a":1e400}`, "\ufeff{}", `{"a":"<&>"}`,
}

func TestJSONObject(t *testing.T) {
	t.Parallel()
	for _, in := range jsonObjectCases {
		_, err := jsonObject(in)
		if got, want := err == nil, oldIsJSONObject(in); got != want {
			t.Errorf("jsonObject(%q) accepts = %v, the unmarshalling check says %v", in, got, want)
		}
	}
}

// FuzzJSONObject: the cheap check accepts exactly what unmarshalling into a
// map accepted, so a bad schema gets the same INVALID_ARGUMENT as before.
func FuzzJSONObject(f *testing.F) {
	for _, in := range jsonObjectCases {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in string) {
		_, err := jsonObject(in)
		if got, want := err == nil, oldIsJSONObject(in); got != want {
			t.Fatalf("jsonObject(%q) accepts = %v, the unmarshalling check says %v", in, got, want)
		}
	})
}
