package toolsdk

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Schema is the subset of JSON Schema the SDK derives from Go types and
// validates against: the typed-tool DSL of the original harness (string,
// number, integer, boolean, object, array; required, enum, description,
// default, nested properties and items). A Schema with an empty Type accepts
// any JSON value (fields of type any or json.RawMessage).
//
// Marshalled, a Schema keeps its properties in declaration order, omits an
// empty required list and never emits additionalProperties: extra keys are
// allowed, as the original's schemaSpecToJsonSchema did.
type Schema struct {
	Type        string
	Description string
	Enum        []string
	Default     json.RawMessage
	// Properties of an object, in declaration order.
	Properties []Property
	// Items of an array.
	Items *Schema
}

// Property is one named property of an object schema.
type Property struct {
	Name     string
	Required bool
	Schema   *Schema
}

// MarshalJSON renders the schema as JSON Schema text with stable key order.
func (s *Schema) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	s.write(&b)
	return b.Bytes(), nil
}

func (s *Schema) write(b *bytes.Buffer) {
	b.WriteByte('{')
	n := 0
	key := func(k string) {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(strconv.Quote(k))
		b.WriteByte(':')
	}
	str := func(v string) {
		enc, _ := json.Marshal(v)
		b.Write(enc)
	}
	if s.Type != "" {
		key("type")
		str(s.Type)
	}
	if s.Description != "" {
		key("description")
		str(s.Description)
	}
	if len(s.Enum) > 0 {
		key("enum")
		b.WriteByte('[')
		for i, e := range s.Enum {
			if i > 0 {
				b.WriteByte(',')
			}
			str(e)
		}
		b.WriteByte(']')
	}
	if len(s.Default) > 0 {
		key("default")
		b.Write(s.Default)
	}
	if s.Type == "object" && s.Properties != nil {
		key("properties")
		b.WriteByte('{')
		for i, p := range s.Properties {
			if i > 0 {
				b.WriteByte(',')
			}
			str(p.Name)
			b.WriteByte(':')
			p.Schema.write(b)
		}
		b.WriteByte('}')
		var req []string
		for _, p := range s.Properties {
			if p.Required {
				req = append(req, p.Name)
			}
		}
		if len(req) > 0 {
			key("required")
			b.WriteByte('[')
			for i, r := range req {
				if i > 0 {
					b.WriteByte(',')
				}
				str(r)
			}
			b.WriteByte(']')
		}
	}
	if s.Type == "array" && s.Items != nil {
		key("items")
		s.Items.write(b)
	}
	b.WriteByte('}')
}

// SchemaFor derives the JSON Schema of a Go type. Args types are structs;
// their exported fields become properties named by the `json` tag (fields
// tagged `json:"-"` are skipped, embedded structs are flattened). The
// `jsonschema` tag refines a field, comma separated:
//
//	required          the key must be present
//	enum=a|b|c        the value must be one of the listed strings
//	default=<json>    documented default (never applied)
//	description=...   the description; it must come last and may contain commas
//
// Go types map as: string → string; bool → boolean; signed and unsigned
// integers → integer; floats → number; structs → object with properties;
// map[string]T → object; slices and arrays → array with items; pointers →
// their element; any and json.RawMessage → any value.
func SchemaFor[T any]() (*Schema, error) {
	return schemaOf(reflect.TypeFor[T](), nil)
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

func schemaOf(t reflect.Type, seen []reflect.Type) (*Schema, error) {
	if t == rawMessageType {
		return &Schema{}, nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		return schemaOf(t.Elem(), seen)
	case reflect.Interface:
		return &Schema{}, nil
	case reflect.String:
		return &Schema{Type: "string"}, nil
	case reflect.Bool:
		return &Schema{Type: "boolean"}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return &Schema{Type: "integer"}, nil
	case reflect.Float32, reflect.Float64:
		return &Schema{Type: "number"}, nil
	case reflect.Slice, reflect.Array:
		items, err := schemaOf(t.Elem(), seen)
		if err != nil {
			return nil, err
		}
		return &Schema{Type: "array", Items: items}, nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return nil, fmt.Errorf("map key type %s: only string keys map to JSON objects", t.Key())
		}
		return &Schema{Type: "object"}, nil
	case reflect.Struct:
		if slices.Contains(seen, t) {
			return nil, fmt.Errorf("recursive type %s cannot be described without $ref", t)
		}
		s := &Schema{Type: "object", Properties: []Property{}}
		if err := addFields(s, t, append(seen, t)); err != nil {
			return nil, err
		}
		return s, nil
	default:
		return nil, fmt.Errorf("type %s has no JSON Schema equivalent", t)
	}
}

func addFields(s *Schema, t reflect.Type, seen []reflect.Type) error {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" && opts == "" {
			continue
		}
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				if err := addFields(s, et, seen); err != nil {
					return err
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		ps, err := schemaOf(f.Type, seen)
		if err != nil {
			return fmt.Errorf("field %s: %w", f.Name, err)
		}
		p := Property{Name: name, Schema: ps}
		if err := applyTag(&p, f.Tag.Get("jsonschema")); err != nil {
			return fmt.Errorf("field %s: %w", f.Name, err)
		}
		if slices.ContainsFunc(s.Properties, func(q Property) bool { return q.Name == name }) {
			return fmt.Errorf("field %s: duplicate property %q", f.Name, name)
		}
		s.Properties = append(s.Properties, p)
	}
	return nil
}

func applyTag(p *Property, tag string) error {
	for tag != "" {
		var part string
		if strings.HasPrefix(tag, "description=") {
			part, tag = tag, ""
		} else {
			part, tag, _ = strings.Cut(tag, ",")
		}
		k, v, _ := strings.Cut(part, "=")
		switch strings.TrimSpace(k) {
		case "":
		case "required":
			p.Required = true
		case "description":
			p.Schema.Description = v
		case "enum":
			if v == "" {
				return fmt.Errorf("empty enum")
			}
			p.Schema.Enum = strings.Split(v, "|")
		case "default":
			if !json.Valid([]byte(v)) {
				return fmt.Errorf("default %q is not JSON", v)
			}
			p.Schema.Default = json.RawMessage(v)
		default:
			return fmt.Errorf("unknown jsonschema tag key %q", k)
		}
	}
	return nil
}
