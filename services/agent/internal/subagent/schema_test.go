package subagent

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestCheckSchema(t *testing.T) {
	cases := []struct {
		name, schema string
		want         []string // substrings of the violations, in order; none: valid
	}{
		{"object", `{"type":"object","properties":{"a":{"type":"string","description":"x"},"b":{"type":"array","items":{"type":"integer"}}},"required":["a"],"additionalProperties":false}`, nil},
		{"enum_const", `{"type":"object","properties":{"k":{"type":"string","enum":["a","b"]},"c":{"type":"number","const":1}}}`, nil},
		{"not_json", `{`, []string{"not JSON"}},
		{"array_root", `{"type":"array","items":{"type":"string"}}`, []string{"root must be a node of type object"}},
		{"unknown_keyword", `{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}`, []string{`$.properties.a: keyword "pattern"`}},
		{"undeclared_required", `{"type":"object","properties":{"a":{"type":"string"}},"required":["b"]}`, []string{"b is not a declared property"}},
		{"bad_type", `{"type":"object","properties":{"a":{"type":"date"}}}`, []string{"$.properties.a: type must be"}},
		{"additional_schema", `{"type":"object","additionalProperties":{"type":"string"}}`, []string{"additionalProperties: must be a boolean"}},
		{"enum_object", `{"type":"object","properties":{"a":{"type":"string","enum":[{"x":1}]}}}`, []string{"enum: values must be scalars"}},
		{"items_on_object", `{"type":"object","items":{"type":"string"}}`, []string{"only an array node has items"}},
		{"all_listed", `{"type":"object","properties":{"a":{"type":"x","format":"y"}},"required":["z"]}`,
			[]string{`keyword "format"`, "type must be", "z is not a declared"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := CheckSchema(c.schema)
			if len(got) != len(c.want) {
				t.Fatalf("violations %q, want %d like %q", got, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to mention %q", i, got[i], w)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	schema := `{"type":"object","properties":{"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string","enum":["a","b"]}},"k":{"type":"string","const":"x"}},"required":["n"],"additionalProperties":false}`
	cases := []struct {
		name, value string
		want        []string
	}{
		{"ok", `{"n":3,"tags":["a","b"],"k":"x"}`, nil},
		{"missing", `{}`, []string{`$: missing required property "n"`}},
		{"wrong_type", `{"n":1.5}`, []string{"$.n: want integer, got number"}},
		{"enum", `{"n":1,"tags":["c"]}`, []string{`$.tags[0]: "c" is not one of`}},
		{"const", `{"n":1,"k":"y"}`, []string{`$.k: must be "x"`}},
		{"extra", `{"n":1,"z":true}`, []string{`property "z" is not allowed`}},
		{"not_object", `[1]`, []string{"$: want object, got array"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var v any
			if err := json.Unmarshal([]byte(c.value), &v); err != nil {
				t.Fatal(err)
			}
			got := Validate(schema, v)
			if len(got) != len(c.want) {
				t.Fatalf("violations %q, want %q", got, c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want %q", i, got[i], w)
				}
			}
		})
	}
}

// FuzzSchema: checking any text never panics, and a schema the check
// accepts validates any JSON value without panicking.
func FuzzSchema(f *testing.F) {
	f.Add(`{"type":"object","properties":{"a":{"type":"array","items":{"type":"null"}}},"required":["a"]}`, `{"a":[null]}`)
	f.Add(`{"type":"object","properties":{"e":{"type":"string","enum":["x",1,null]}}}`, `{"e":"x"}`)
	f.Add(`{"type":"object","required":[1]}`, `{}`)
	f.Fuzz(func(t *testing.T, schema, value string) {
		if len(CheckSchema(schema)) > 0 {
			return
		}
		var v any
		if json.Unmarshal([]byte(value), &v) != nil {
			return
		}
		_ = Validate(schema, v)
	})
}
