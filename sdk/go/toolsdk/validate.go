package toolsdk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// ArgsError is the typed failure of argument validation: code INVALID_ARGS,
// one violation per offending path, in schema declaration order. The host
// turns it into an is_error result whose text lists every violation so the
// model can correct its call.
type ArgsError struct {
	Violations []string
}

// Error renders "invalid arguments: v1; v2; ...".
func (e *ArgsError) Error() string {
	return "invalid arguments: " + strings.Join(e.Violations, "; ")
}

// Code is the stable code INVALID_ARGS.
func (e *ArgsError) Code() string { return CodeInvalidArgs }

// ErrorName is the error class carried on the result, ToolArgsError.
func (e *ArgsError) ErrorName() string { return "ToolArgsError" }

// Validate checks raw JSON argument text against s and returns every
// violation (nil when valid). The top level must be a JSON object. Keys the
// schema does not declare are allowed; defaults are not applied; an
// optional property that is null counts as absent (models often send null
// for "not given"), a required one that is null is a type violation.
func Validate(s *Schema, args []byte) []string {
	v, err := decodeJSON(args)
	if err != nil {
		return []string{"arguments are not valid JSON: " + err.Error()}
	}
	if _, ok := v.(map[string]any); !ok {
		return []string{`"arguments" must be an object`}
	}
	var out []string
	s.check(v, "", &out)
	return out
}

// errEndOfInput is the reason for empty or truncated argument text, worded as
// encoding/json's Unmarshal (and JavaScript's JSON.parse) word it; the
// Python and TypeScript SDKs use the same words (conformance suite).
var errEndOfInput = errors.New("unexpected end of JSON input")

// decodeJSON decodes exactly one JSON value. Its errors are the reasons every
// dsh host gives after "arguments are not valid JSON: ".
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, errEndOfInput
		}
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

func (s *Schema) check(v any, path string, out *[]string) {
	name := path
	if name == "" {
		name = "arguments"
	}
	bad := func(what string) { *out = append(*out, fmt.Sprintf("%q must be %s", name, what)) }
	switch s.Type {
	case "string":
		if _, ok := v.(string); !ok {
			bad("a string")
			return
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			bad("a boolean")
			return
		}
	case "number":
		if _, ok := v.(json.Number); !ok {
			bad("a number")
			return
		}
	case "integer":
		n, ok := v.(json.Number)
		if !ok || !isInteger(n) {
			bad("an integer")
			return
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			bad("an array")
			return
		}
		if s.Items != nil {
			for i, it := range arr {
				s.Items.check(it, fmt.Sprintf("%s[%d]", path, i), out)
			}
		}
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			bad("an object")
			return
		}
		for _, p := range s.Properties {
			pp := p.Name
			if path != "" {
				pp = path + "." + p.Name
			}
			pv, present := obj[p.Name]
			if !present || (pv == nil && !p.Required) {
				if p.Required {
					*out = append(*out, fmt.Sprintf("missing required property %q", pp))
				}
				continue
			}
			p.Schema.check(pv, pp, out)
		}
		s.checkKeyCase(obj, path, out)
	}
	if len(s.Enum) > 0 {
		var key string
		if str, ok := v.(string); ok {
			key = str
		} else {
			b, _ := json.Marshal(v)
			key = string(b)
		}
		if !slices.Contains(s.Enum, key) {
			bad("one of [" + strings.Join(s.Enum, ", ") + "]")
		}
	}
}

// checkKeyCase refuses a key of obj that names one of s's properties only
// when case is ignored. A typed tool's arguments are decoded with
// encoding/json, which takes such a key for the property (the last of
// them winning), while the validation above, the agent's approval rules
// and every other host read the exact key: {"command":"ls","COMMAND":"rm"}
// would be approved as ls and run as rm.
func (s *Schema) checkKeyCase(obj map[string]any, path string, out *[]string) {
	var bad []string
	for k := range obj {
		if slices.ContainsFunc(s.Properties, func(p Property) bool { return p.Name == k }) {
			continue
		}
		for _, p := range s.Properties {
			if strings.EqualFold(k, p.Name) {
				name := k
				if path != "" {
					name = path + "." + k
				}
				bad = append(bad, fmt.Sprintf("property %q is not %q: keys are case-sensitive", name, p.Name))
				break
			}
		}
	}
	slices.Sort(bad)
	*out = append(*out, bad...)
}

// isInteger reports whether n is an integral value that fits int64, the
// range every Go integer field of an Args struct can hold or reject cleanly.
func isInteger(n json.Number) bool {
	if _, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return true
	}
	f, ok := new(big.Float).SetString(string(n))
	if !ok || !f.IsInt() {
		return false
	}
	_, acc := f.Int64()
	return acc == big.Exact
}

// unmarshalArgs decodes validated argument text into a Go value. Integral
// numbers written as 2.0 or 3e2 satisfy "integer" in JSON Schema but not
// encoding/json's int decoding, so on failure the numbers are rewritten in
// integer form and decoding is retried.
func unmarshalArgs(raw []byte, dst any) error {
	err := json.Unmarshal(raw, dst)
	if err == nil {
		return nil
	}
	v, derr := decodeJSON(raw)
	if derr != nil {
		return err
	}
	b, merr := json.Marshal(normalizeNumbers(v))
	if merr != nil {
		return err
	}
	return json.Unmarshal(b, dst)
}

func normalizeNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if f, ok := new(big.Float).SetString(string(x)); ok && f.IsInt() {
			if i, acc := f.Int64(); acc == big.Exact {
				return json.Number(strconv.FormatInt(i, 10))
			}
		}
		return x
	case []any:
		for i := range x {
			x[i] = normalizeNumbers(x[i])
		}
		return x
	case map[string]any:
		for k := range x {
			x[k] = normalizeNumbers(x[k])
		}
		return x
	}
	return v
}
