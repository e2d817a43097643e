package toolsdk

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

type nested struct {
	Label string `json:"label" jsonschema:"required"`
	Note  string `json:"note,omitempty"`
}

type Embedded struct {
	Extra bool `json:"extra"`
}

type sampleArgs struct {
	Embedded
	Command string            `json:"command" jsonschema:"required,description=The command to run, verbatim."`
	Mode    string            `json:"mode" jsonschema:"enum=fast|slow,default=\"fast\""`
	Count   int               `json:"count"`
	Ratio   *float64          `json:"ratio"`
	Tags    []string          `json:"tags"`
	Items   []nested          `json:"items" jsonschema:"required"`
	Owner   *nested           `json:"owner"`
	Labels  map[string]string `json:"labels"`
	Raw     json.RawMessage   `json:"raw"`
	Skip    string            `json:"-"`
	hidden  string
}

func TestSchemaForGolden(t *testing.T) {
	t.Parallel()
	s, err := SchemaFor[sampleArgs]()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.MarshalJSON()
	var pretty map[string]any
	if err := json.Unmarshal(got, &pretty); err != nil {
		t.Fatalf("schema is not JSON: %v\n%s", err, got)
	}
	golden := filepath.Join("testdata", "sample_schema.json")
	if *update {
		if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), string(got)+"\n"); diff != "" {
		t.Errorf("schema mismatch (-want +got):\n%s", diff)
	}
}

func TestSchemaForRejects(t *testing.T) {
	t.Parallel()
	type recursive struct {
		Next *recursive `json:"next"`
	}
	type badTag struct {
		A string `jsonschema:"requird"`
	}
	type badKey struct {
		M map[int]string `json:"m"`
	}
	type fn struct {
		F func() `json:"f"`
	}
	for name, f := range map[string]func() error{
		"recursive": func() error { _, err := SchemaFor[recursive](); return err },
		"bad tag":   func() error { _, err := SchemaFor[badTag](); return err },
		"map key":   func() error { _, err := SchemaFor[badKey](); return err },
		"func":      func() error { _, err := SchemaFor[fn](); return err },
	} {
		if f() == nil {
			t.Errorf("%s: SchemaFor accepted an unsupported type", name)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	s, err := SchemaFor[sampleArgs]()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args string
		want []string
	}{
		{"valid minimal", `{"command":"ls","items":[]}`, nil},
		{"extra keys allowed", `{"command":"ls","items":[],"whatever":1}`, nil},
		{"null optional is absent", `{"command":"ls","items":[],"mode":null}`, nil},
		{"not json", `{"command":`, []string{"arguments are not valid JSON: unexpected end of JSON input"}},
		{"trailing data", `{} {}`, []string{"arguments are not valid JSON: unexpected data after the JSON value"}},
		{"not an object", `[1]`, []string{`"arguments" must be an object`}},
		{"null", `null`, []string{`"arguments" must be an object`}},
		{"every violation", `{"mode":"medium","count":1.5,"ratio":"x","tags":[1,"a",true],"items":[{"note":3}],"owner":{"label":null},"labels":[]}`, []string{
			`missing required property "command"`,
			`"mode" must be one of [fast, slow]`,
			`"count" must be an integer`,
			`"ratio" must be a number`,
			`"tags[0]" must be a string`,
			`"tags[2]" must be a string`,
			`missing required property "items[0].label"`,
			`"items[0].note" must be a string`,
			`"owner.label" must be a string`,
			`"labels" must be an object`,
		}},
		{"integral float is an integer", `{"command":"x","items":[],"count":2.0}`, nil},
		{"required null", `{"command":null,"items":[]}`, []string{`"command" must be a string`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, Validate(s, []byte(tt.args))); diff != "" {
				t.Errorf("Validate(%s) (-want +got):\n%s", tt.args, diff)
			}
		})
	}
}

func FuzzValidate(f *testing.F) {
	s, err := SchemaFor[sampleArgs]()
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{`{}`, `{"command":"ls","items":[{"label":"a"}]}`, `[`, `{"tags":[1,2]}`, `"x"`, `{"count":1e400}`, `{"command":"x","items":[],"count":1e400}`, `{"command":"x","items":[],"count":3e2}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		v := Validate(s, []byte(in))
		if len(v) == 0 {
			// Valid arguments must decode into the Go type.
			var a sampleArgs
			if err := unmarshalArgs([]byte(in), &a); err != nil {
				t.Fatalf("validated %q but it does not decode: %v", in, err)
			}
		}
	})
}
