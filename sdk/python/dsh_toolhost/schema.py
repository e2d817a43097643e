"""JSON Schema from Python type hints, and argument validation.

The schema subset is the one of the dsh typed tool DSL (semantics §6.2):
``type`` (string, number, integer, boolean, object, array), ``description``,
``enum``, ``default``, ``properties`` + ``required`` for objects and ``items``
for arrays. ``required`` lists required keys in declaration order and is
omitted when empty; there is no ``additionalProperties``.

:func:`validate` follows the same rules as the Go SDK and the original
``validateArgs``: the top level must be a non-array object; every declared key
is checked in order (a missing key is a violation only when required; a JSON
``null`` counts as absent for an optional property and is a type violation
for a required one); types are checked, objects recurse into their
declared properties, arrays check each item with the path ``p[i]``; then enum
membership. Extra keys are allowed and defaults are never applied.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import types
import typing
from typing import Any, Literal, Union

__all__ = ["schema_for_type", "validate", "parse_docstring", "SchemaError"]


class SchemaError(TypeError):
    """A type hint the SDK cannot express as a JSON Schema."""


_TYPE_NAMES = {str: "string", bool: "boolean", int: "integer", float: "number"}


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


def schema_for_type(tp: Any, description: str = "") -> dict:
    """Return the JSON Schema of one type hint (Optional is unwrapped)."""
    tp, _ = unwrap_optional(tp)
    s = _schema(tp)
    if description:
        s = {"type": s["type"], "description": description, **{k: v for k, v in s.items() if k != "type"}}
    return s


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """Strip ``Optional[...]`` / ``X | None``; report whether it was optional."""
    origin = typing.get_origin(tp)
    if origin is Union or (sys.version_info >= (3, 10) and origin is types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
        raise SchemaError(f"union types are not supported: {tp!r}")
    return tp, False


def _schema(tp: Any) -> dict:
    if tp in _TYPE_NAMES:
        return {"type": _TYPE_NAMES[tp]}
    if tp is Any:
        raise SchemaError("Any is not supported; use dict or a concrete type")
    origin = typing.get_origin(tp)
    if origin is Literal:
        values = list(typing.get_args(tp))
        kinds = {_TYPE_NAMES.get(type(v)) for v in values}
        if len(kinds) != 1 or None in kinds:
            raise SchemaError(f"Literal values must share one scalar type: {tp!r}")
        return {"type": kinds.pop(), "enum": values}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.value for m in tp]
        kinds = {_TYPE_NAMES.get(type(v)) for v in values}
        if len(kinds) != 1 or None in kinds:
            raise SchemaError(f"Enum values must share one scalar type: {tp!r}")
        return {"type": kinds.pop(), "enum": values}
    if tp is list or origin is list:
        args = typing.get_args(tp)
        s: dict = {"type": "array"}
        if args:
            s["items"] = _schema(unwrap_optional(args[0])[0])
        return s
    if tp is dict or origin is dict:
        return {"type": "object"}
    if _is_typeddict(tp):
        hints = typing.get_type_hints(tp)
        docs = parse_docstring(tp.__doc__ or "")[1]
        required_keys = getattr(tp, "__required_keys__", frozenset(hints))
        props, required = {}, []
        for name, hint in hints.items():
            inner, optional = unwrap_optional(hint)
            props[name] = schema_for_type(inner, docs.get(name, ""))
            if name in required_keys and not optional:
                required.append(name)
        return _object(props, required)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        docs = parse_docstring(tp.__doc__ or "")[1]
        props, required = {}, []
        for f in dataclasses.fields(tp):
            inner, optional = unwrap_optional(hints[f.name])
            props[f.name] = schema_for_type(inner, docs.get(f.name, ""))
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if not has_default and not optional:
                required.append(f.name)
            elif f.default is not dataclasses.MISSING and f.default is not None and _jsonable(f.default):
                props[f.name]["default"] = f.default
        return _object(props, required)
    raise SchemaError(f"unsupported type hint {tp!r}")


def _object(props: dict, required: list) -> dict:
    s: dict = {"type": "object", "properties": props}
    if required:
        s["required"] = required
    return s


def _jsonable(v: Any) -> bool:
    if isinstance(v, (str, bool, int, float)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_jsonable(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _jsonable(x) for k, x in v.items())
    return False


def _type_ok(want: str, v: Any) -> bool:
    if want == "string":
        return isinstance(v, str)
    if want == "boolean":
        return isinstance(v, bool)
    if want == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if want == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    if want == "object":
        return isinstance(v, dict)
    if want == "array":
        return isinstance(v, list)
    return True


def _article(t: str) -> str:
    return "an" if t[:1] in "aeiou" else "a"


def _enum_text(values: list) -> str:
    return "[" + ", ".join(v if isinstance(v, str) else _json_scalar(v) for v in values) + "]"


def _json_scalar(v: Any) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    return str(v)


def validate(schema: dict, args: Any) -> list[str]:
    """Return the violations of ``args`` against an object ``schema`` (empty = valid).

    Total: never raises, whatever ``args`` is.
    """
    if not isinstance(args, dict):
        return ['"arguments" must be an object']
    out: list[str] = []
    _check_props(schema, args, "", out)
    return out


def _check_props(schema: dict, obj: dict, prefix: str, out: list[str]) -> None:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    for key, prop in props.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in obj or (obj[key] is None and key not in required):
            if key in required:
                out.append(f'missing required property "{path}"')
            continue
        v = obj[key]
        _check_value(prop, v, path, out)


def _check_value(prop: dict, v: Any, path: str, out: list[str]) -> None:
    want = prop.get("type")
    if isinstance(want, str) and (v is None or not _type_ok(want, v)):
        out.append(f'"{path}" must be {_article(want)} {want}')
        return
    if want == "object" and isinstance(v, dict) and "properties" in prop:
        _check_props(prop, v, path, out)
    if want == "array" and isinstance(v, list) and isinstance(prop.get("items"), dict):
        for i, item in enumerate(v):
            ipath = f"{path}[{i}]"
            _check_value(prop["items"], item, ipath, out)
    enum_values = prop.get("enum")
    if isinstance(enum_values, list) and not any(_same(v, e) for e in enum_values):
        out.append(f'"{path}" must be one of {_enum_text(enum_values)}')


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Attributes|Fields|Returns|Return|Yields|Raises|Examples?|Notes?):\s*$")
_ARG = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX = re.compile(r"^:param\s+(?:[^:]*\s)?([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google- or Sphinx-style docstring into (description, {arg: doc})."""
    lines = inspect.cleandoc(doc or "").splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    arg_indent = None
    for raw in lines:
        line = raw.strip()
        m = _SECTION.match(line)
        if m and not raw.startswith((" ", "\t")):
            section = m.group(1)
            current, arg_indent = None, None
            continue
        sm = _SPHINX.match(line)
        if sm:
            current = sm.group(1)
            args[current] = sm.group(2).strip()
            section = "Sphinx"
            continue
        if section is None:
            desc.append(raw)
            continue
        if section in ("Args", "Arguments", "Parameters", "Params", "Attributes", "Fields"):
            indent = len(raw) - len(raw.lstrip())
            am = _ARG.match(line)
            if am and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = am.group(1).lstrip("*")
                args[current] = am.group(3).strip()
            elif current and line:
                args[current] = (args[current] + " " + line).strip()
        elif section == "Sphinx" and current and line and not line.startswith(":"):
            args[current] = (args[current] + " " + line).strip()
    return "\n".join(desc).strip(), args
