import json
import os
import sys
import unittest
from dataclasses import dataclass
from typing import Literal, Optional, TypedDict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dsh_toolhost import SchemaError, ToolContext, tool, validate  # noqa: E402
from dsh_toolhost.schema import parse_docstring  # noqa: E402


class Point(TypedDict):
    """A point.

    Attributes:
        x: Horizontal.
        y: Vertical.
    """

    x: float
    y: float


@dataclass
class Box:
    """A box.

    Attributes:
        label: The label.
    """

    label: str
    points: list[Point]
    color: Literal["red", "blue"] = "red"


class SchemaFromHints(unittest.TestCase):
    def test_full_signature(self):
        @tool
        def f(path: str, count: int, ratio: float, on: bool, tags: list[str], extra: dict,
              mode: Literal["a", "b"], box: Box, maybe: Optional[str] = None, n: int = 3,
              ctx: ToolContext = None) -> str:
            """Do a thing.

            Second line.

            Args:
                path: The path.
                count: How many,
                    continued here.
                mode: The mode.
            Returns:
                Nothing useful.
            """
            return ""

        self.assertEqual(f.name, "f")
        self.assertEqual(f.description, "Do a thing.\n\nSecond line.")
        want = {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The path."},
                "count": {"type": "integer", "description": "How many, continued here."},
                "ratio": {"type": "number"},
                "on": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "extra": {"type": "object"},
                "mode": {"type": "string", "description": "The mode.", "enum": ["a", "b"]},
                "box": {"type": "object", "properties": {
                    "label": {"type": "string", "description": "The label."},
                    "points": {"type": "array", "items": {"type": "object", "properties": {
                        "x": {"type": "number", "description": "Horizontal."},
                        "y": {"type": "number", "description": "Vertical."}}, "required": ["x", "y"]}},
                    "color": {"type": "string", "enum": ["red", "blue"], "default": "red"}},
                    "required": ["label", "points"]},
                "maybe": {"type": "string"},
                "n": {"type": "integer", "default": 3},
            },
            "required": ["path", "count", "ratio", "on", "tags", "extra", "mode", "box"],
        }
        self.assertEqual(f.parameters, want)
        d = f.descriptor()
        self.assertEqual(json.loads(d.schema.parameters), want)
        self.assertTrue(d.validates_arguments)

    def test_required_omitted_when_empty(self):
        @tool
        def g(x: Optional[int] = None) -> str:
            """G."""
            return ""

        self.assertNotIn("required", g.parameters)

    def test_unsupported_hints(self):
        from typing import Any, Union
        for hint in (Any, Union[int, str], set, Literal[1, "a"]):
            with self.subTest(hint=hint):
                def h(x):
                    return ""
                h.__annotations__ = {"x": hint}
                with self.assertRaises(SchemaError):
                    tool(h)

    def test_sphinx_docstring(self):
        desc, args = parse_docstring("""Summary.

        :param a: first
            more
        :param int b: second
        """)
        self.assertEqual(desc, "Summary.")
        self.assertEqual(args, {"a": "first more", "b": "second"})


SPEC = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "count": {"type": "number"},
        "n": {"type": "integer"},
        "on": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["plain", "upper"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "opts": {"type": "object", "properties": {"flag": {"type": "boolean"}}, "required": ["flag"]},
        "free": {"type": "object"},
        "list": {"type": "array"},
    },
    "required": ["name"],
}


class Validate(unittest.TestCase):
    def test_table(self):
        cases = [
            ("valid minimal", {"name": "x"}, []),
            ("extra keys allowed", {"name": "x", "zzz": 1}, []),
            ("not an object", [1], ['"arguments" must be an object']),
            ("string top", "x", ['"arguments" must be an object']),
            ("missing required", {}, ['missing required property "name"']),
            ("required null", {"name": None}, ['"name" must be a string']),
            ("optional null is absent", {"name": "x", "count": None}, []),
            ("wrong string", {"name": 1}, ['"name" must be a string']),
            ("bool is not a number", {"name": "x", "count": True}, ['"count" must be a number']),
            ("integer", {"name": "x", "n": 1.5}, ['"n" must be an integer']),
            ("integral float is an integer", {"name": "x", "n": 2.0}, []),
            ("boolean", {"name": "x", "on": "yes"}, ['"on" must be a boolean']),
            ("enum", {"name": "x", "mode": "loud"}, ['"mode" must be one of [plain, upper]']),
            ("enum type first", {"name": "x", "mode": 3}, ['"mode" must be a string']),
            ("array items", {"name": "x", "tags": ["a", 2, None]},
             ['"tags[1]" must be a string', '"tags[2]" must be a string']),
            ("array type", {"name": "x", "tags": "a"}, ['"tags" must be an array']),
            ("nested missing", {"name": "x", "opts": {}}, ['missing required property "opts.flag"']),
            ("nested type", {"name": "x", "opts": {"flag": 1}}, ['"opts.flag" must be a boolean']),
            ("object type-only", {"name": "x", "free": {"anything": [1]}}, []),
            ("object wrong", {"name": "x", "free": []}, ['"free" must be an object']),
            ("array untyped", {"name": "x", "list": [1, "a"]}, []),
            ("order is declaration order", {"opts": {}, "name": 2, "mode": "q"},
             ['"name" must be a string', '"mode" must be one of [plain, upper]', 'missing required property "opts.flag"']),
        ]
        for name, args, want in cases:
            with self.subTest(name):
                self.assertEqual(validate(SPEC, args), want)

    def test_total(self):
        for junk in (None, 1, 1.5, "s", [], [{}], {"name": object()}):
            with self.subTest(junk=junk):
                self.assertIsInstance(validate(SPEC, junk), list)


if __name__ == "__main__":
    unittest.main()
