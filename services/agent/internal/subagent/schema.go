package subagent

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// The structured-output schema subset (semantics.md §6.8): an object-rooted
// tree of nodes with type (object, array, string, number, integer, boolean,
// null), properties, required (declared names only), additionalProperties
// (boolean), items, enum and const (scalars), and the annotations
// description, title, default and examples.

var schemaTypes = map[string]bool{"object": true, "array": true, "string": true, "number": true,
	"integer": true, "boolean": true, "null": true}

var schemaKeys = map[string]bool{"type": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "enum": true, "const": true, "description": true, "title": true, "default": true, "examples": true}

// CheckSchema reports every way schema leaves the §6.8 subset (nil when it
// is inside it); each violation names its path.
func CheckSchema(schema string) []string {
	var root any
	if err := json.Unmarshal([]byte(schema), &root); err != nil {
		return []string{fmt.Sprintf("output_schema is not JSON: %v", err)}
	}
	var errs []string
	node, ok := root.(map[string]any)
	if !ok || node["type"] != "object" {
		errs = append(errs, "$: the root must be a node of type object")
	}
	checkNode("$", root, &errs)
	return errs
}

func checkNode(path string, v any, errs *[]string) {
	n, ok := v.(map[string]any)
	if !ok {
		*errs = append(*errs, path+": a schema node must be an object")
		return
	}
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !schemaKeys[k] {
			*errs = append(*errs, fmt.Sprintf("%s: keyword %q is outside the supported subset", path, k))
		}
	}
	typ, _ := n["type"].(string)
	if !schemaTypes[typ] {
		*errs = append(*errs, fmt.Sprintf("%s: type must be one of object, array, string, number, integer, boolean, null", path))
	}
	props, hasProps := n["properties"]
	if hasProps {
		pm, ok := props.(map[string]any)
		switch {
		case !ok:
			*errs = append(*errs, path+".properties: must be an object")
		case typ != "object":
			*errs = append(*errs, path+".properties: only an object node has properties")
		default:
			names := make([]string, 0, len(pm))
			for k := range pm {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				checkNode(path+".properties."+k, pm[k], errs)
			}
		}
	}
	if req, ok := n["required"]; ok {
		list, isList := req.([]any)
		pm, _ := props.(map[string]any)
		if !isList {
			*errs = append(*errs, path+".required: must be an array of property names")
		}
		for _, r := range list {
			name, isStr := r.(string)
			if _, declared := pm[name]; !isStr || !declared {
				*errs = append(*errs, fmt.Sprintf("%s.required: %v is not a declared property", path, r))
			}
		}
	}
	if ap, ok := n["additionalProperties"]; ok {
		if _, isBool := ap.(bool); !isBool {
			*errs = append(*errs, path+".additionalProperties: must be a boolean")
		}
	}
	if items, ok := n["items"]; ok {
		if typ != "array" {
			*errs = append(*errs, path+".items: only an array node has items")
		} else {
			checkNode(path+".items", items, errs)
		}
	}
	if e, ok := n["enum"]; ok {
		list, isList := e.([]any)
		if !isList || len(list) == 0 {
			*errs = append(*errs, path+".enum: must be a non-empty array of scalars")
		}
		for _, x := range list {
			if !scalar(x) {
				*errs = append(*errs, path+".enum: values must be scalars")
				break
			}
		}
	}
	if c, ok := n["const"]; ok && !scalar(c) {
		*errs = append(*errs, path+".const: must be a scalar")
	}
}

func scalar(v any) bool {
	switch v.(type) {
	case nil, string, float64, bool:
		return true
	}
	return false
}

// Validate returns the path-qualified violations of value against schema
// (which passed CheckSchema); nil when it satisfies it.
func Validate(schema string, value any) []string {
	var root any
	if err := json.Unmarshal([]byte(schema), &root); err != nil {
		return []string{"schema: " + err.Error()}
	}
	var errs []string
	validate("$", root.(map[string]any), value, &errs)
	return errs
}

func validate(path string, n map[string]any, v any, errs *[]string) {
	typ, _ := n["type"].(string)
	if !hasType(typ, v) {
		*errs = append(*errs, fmt.Sprintf("%s: want %s, got %s", path, typ, jsonType(v)))
		return
	}
	if e, ok := n["enum"].([]any); ok && !contains(e, v) {
		*errs = append(*errs, fmt.Sprintf("%s: %s is not one of the allowed values", path, compact(v)))
	}
	if c, ok := n["const"]; ok && c != v {
		*errs = append(*errs, fmt.Sprintf("%s: must be %s", path, compact(c)))
	}
	switch typ {
	case "object":
		obj := v.(map[string]any)
		props, _ := n["properties"].(map[string]any)
		req, _ := n["required"].([]any)
		for _, r := range req {
			if _, ok := obj[r.(string)]; !ok {
				*errs = append(*errs, fmt.Sprintf("%s: missing required property %q", path, r))
			}
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, ok := props[k].(map[string]any); ok {
				validate(path+"."+k, p, obj[k], errs)
			} else if n["additionalProperties"] == false {
				*errs = append(*errs, fmt.Sprintf("%s: property %q is not allowed", path, k))
			}
		}
	case "array":
		if items, ok := n["items"].(map[string]any); ok {
			for i, x := range v.([]any) {
				validate(fmt.Sprintf("%s[%d]", path, i), items, x, errs)
			}
		}
	}
}

func hasType(typ string, v any) bool {
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(float64)
		return ok
	case "integer":
		f, ok := v.(float64)
		return ok && f == math.Trunc(f)
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	}
	return false
}

func jsonType(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		if x == math.Trunc(x) {
			return "integer"
		}
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}

func contains(list []any, v any) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func compact(v any) string {
	b, _ := json.Marshal(v)
	return strings.TrimSpace(string(b))
}
