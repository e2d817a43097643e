"""Why argument text is not JSON, worded exactly as every dsh host words it.

The Go, Python and TypeScript hosts (and the MCP bridge) answer invalid
argument JSON with ``arguments are not valid JSON: <reason>``, where reason is
Go's encoding/json syntax error (``invalid character 'x' looking for
beginning of value``, ``... after object key``, ...), ``unexpected end of JSON
input`` for empty or truncated text, and ``unexpected data after the JSON
value`` for text after the first value. The conformance suite
(tests/conformance) checks the three hosts produce identical messages; the
TypeScript twin is sdk/typescript/src/jsonsyntax.js.

The scan runs over the UTF-8 bytes (as Go does), so a stray non-ASCII byte is
quoted the way Go quotes it.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["syntax_error"]

_WS = b" \t\r\n"
_ESCAPES = b'"\\/bfnrtu'
_HEX = b"0123456789abcdefABCDEF"
_DIGITS = b"0123456789"
_LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}
_GO_ESCAPES = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v", 92: "\\\\"}
MAX_DEPTH = 10000


def _quote(c: int) -> str:
    """Go's quoteChar: the byte as a rune, quoted like strconv.Quote."""
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    if c in _GO_ESCAPES:
        return f"'{_GO_ESCAPES[c]}'"
    if c < 0x20 or c == 0x7F:
        return f"'\\x{c:02x}'"
    ch = chr(c)
    if c >= 0x80 and not ch.isprintable() or c == 0xA0 or c == 0xAD:
        return f"'\\u{c:04x}'"
    return f"'{ch}'"


class _Bad(Exception):
    pass


class _Scanner:
    def __init__(self, b: bytes):
        self.b = b
        self.i = 0

    def peek(self) -> int:
        if self.i >= len(self.b):
            raise _Bad("unexpected end of JSON input")
        return self.b[self.i]

    def bad(self, context: str) -> _Bad:
        return _Bad(f"invalid character {_quote(self.b[self.i])} {context}")

    def ws(self) -> None:
        while self.i < len(self.b) and self.b[self.i] in _WS:
            self.i += 1

    def scan(self) -> None:
        """One value, iteratively (nesting up to MAX_DEPTH needs no recursion)."""
        stack: list[int] = []
        want_value = True
        while True:
            if want_value:
                self.ws()
                c = self.peek()
                if c in (0x7B, 0x5B):  # { [
                    if len(stack) >= MAX_DEPTH:
                        raise self.bad("exceeded max depth")
                    stack.append(c)
                    self.i += 1
                    self.ws()
                    if self.peek() == c + 2:  # } ]
                        self.i += 1
                        stack.pop()
                        want_value = False
                    elif c == 0x7B:
                        self.key()
                    continue
                if c == 0x22:
                    self.string()
                elif c == 0x2D or c in _DIGITS:
                    self.number()
                elif c in _LITERALS:
                    self.literal(_LITERALS[c])
                else:
                    raise self.bad("looking for beginning of value")
                want_value = False
                continue
            if not stack:
                return
            self.ws()
            c, top = self.peek(), stack[-1]
            if c == top + 2:
                self.i += 1
                stack.pop()
            elif c == 0x2C:
                self.i += 1
                if top == 0x7B:
                    self.key()
                want_value = True
            else:
                raise self.bad("after object key:value pair" if top == 0x7B else "after array element")

    def key(self) -> None:
        """An object key and its colon."""
        self.ws()
        if self.peek() != 0x22:
            raise self.bad("looking for beginning of object key string")
        self.string()
        self.ws()
        if self.peek() != 0x3A:
            raise self.bad("after object key")
        self.i += 1

    def string(self) -> None:
        self.i += 1
        while True:
            c = self.peek()
            if c == 0x22:
                self.i += 1
                return
            if c == 0x5C:
                self.i += 1
                e = self.peek()
                if e not in _ESCAPES:
                    raise self.bad("in string escape code")
                self.i += 1
                if e == 0x75:  # u
                    for _ in range(4):
                        if self.peek() not in _HEX:
                            raise self.bad("in \\u hexadecimal character escape")
                        self.i += 1
                continue
            if c < 0x20:
                raise self.bad("in string literal")
            self.i += 1

    def digits(self) -> None:
        while self.i < len(self.b) and self.b[self.i] in _DIGITS:
            self.i += 1

    def number(self) -> None:
        if self.peek() == 0x2D:
            self.i += 1
            if self.peek() not in _DIGITS:
                raise self.bad("in numeric literal")
        if self.peek() == 0x30:
            self.i += 1
        else:
            self.digits()
        if self.i < len(self.b) and self.b[self.i] == 0x2E:
            self.i += 1
            if self.peek() not in _DIGITS:
                raise self.bad("after decimal point in numeric literal")
            self.digits()
        if self.i < len(self.b) and self.b[self.i] in b"eE":
            self.i += 1
            if self.peek() in b"+-":
                self.i += 1
            if self.peek() not in _DIGITS:
                raise self.bad("in exponent of numeric literal")
            self.digits()

    def literal(self, word: bytes) -> None:
        self.i += 1
        for want in word[1:]:
            if self.peek() != want:
                raise self.bad(f"in literal {word.decode()} (expecting {_quote(want)})")
            self.i += 1


def syntax_error(text: str) -> Optional[str]:
    """The reason ``text`` is not one JSON value, or None when it is."""
    s = _Scanner(text.encode("utf-8", "surrogatepass"))
    try:
        s.scan()
        s.ws()
        if s.i < len(s.b):
            return "unexpected data after the JSON value"
    except _Bad as e:
        return str(e)
    return None
