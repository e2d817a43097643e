package jsonlstore

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxNameLen bounds an encoded id so that "<name>.cursor" fits in the 255
// bytes most file systems allow for a file name.
const maxNameLen = 240

// EncodeID maps a session id to the base of its file names (semantics.md
// §5.4): per UTF-16 code unit, [A-Za-z0-9._-] stays literal and every other
// unit becomes ~XXXX (4 upper-case hex digits); "." and ".." become ~002E and
// ~002E~002E. The mapping is injective and the result never contains a path
// separator, so no id can escape the root or collide with another id. Empty,
// invalid UTF-8 and over-long ids are refused.
func EncodeID(id string) (string, error) {
	switch {
	case id == "":
		return "", fmt.Errorf("empty session id")
	case !utf8.ValidString(id):
		return "", fmt.Errorf("session id is not valid UTF-8")
	case id == ".":
		return "~002E", nil
	case id == "..":
		return "~002E~002E", nil
	}
	var b strings.Builder
	for _, u := range utf16.Encode([]rune(id)) {
		if literal(u) {
			b.WriteByte(byte(u))
		} else {
			fmt.Fprintf(&b, "~%04X", u)
		}
		if b.Len() > maxNameLen {
			return "", fmt.Errorf("session id too long for a file name (%d bytes encoded, at most %d)", b.Len(), maxNameLen)
		}
	}
	return b.String(), nil
}

// DecodeID inverts EncodeID; it refuses any name EncodeID would not produce.
func DecodeID(name string) (string, error) {
	var units []uint16
	for i := 0; i < len(name); {
		c := name[i]
		if c == '~' {
			if i+5 > len(name) {
				return "", fmt.Errorf("file name %q: truncated escape", name)
			}
			hex := name[i+1 : i+5]
			if strings.ToUpper(hex) != hex {
				return "", fmt.Errorf("file name %q: lower-case escape", name)
			}
			v, err := strconv.ParseUint(hex, 16, 16)
			if err != nil {
				return "", fmt.Errorf("file name %q: bad escape %q", name, name[i:i+5])
			}
			units = append(units, uint16(v))
			i += 5
			continue
		}
		if !literal(uint16(c)) {
			return "", fmt.Errorf("file name %q: unexpected byte %q", name, c)
		}
		units = append(units, uint16(c))
		i++
	}
	id := string(utf16.Decode(units))
	if enc, err := EncodeID(id); err != nil || enc != name {
		return "", fmt.Errorf("file name %q is not a canonical session id encoding", name)
	}
	return id, nil
}

func literal(u uint16) bool {
	return u >= 'a' && u <= 'z' || u >= 'A' && u <= 'Z' || u >= '0' && u <= '9' || u == '.' || u == '_' || u == '-'
}
