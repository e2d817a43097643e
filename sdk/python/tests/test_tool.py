import enum
import json
import os
import sys
import threading
import unittest
from dataclasses import dataclass
from typing import Optional, TypedDict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dsh_toolhost import Output, Tool, ToolContext, run_call, tool  # noqa: E402
from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2  # noqa: E402


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Span(TypedDict):
    start: int
    end: int


@dataclass
class Opts:
    depth: int
    label: Optional[str] = None


def call(t, args, ctx=None, outs=None):
    ex = tools_pb2.ToolExecution(call_id="c", name=t.name, arguments=args if isinstance(args, str) else json.dumps(args))
    return run_call(t, ex, ctx or ToolContext(), (outs if outs is not None else []).append)


def text(r):
    return "".join(b.text.text for b in r.content)


def helper_that_fails(x: int) -> str:
    try:
        return str(1 // 0)
    except ZeroDivisionError as e:
        raise RuntimeError(f"no luck with {x}") from e


class ToolTest(unittest.TestCase):
    def test_argument_conversion(self):
        seen = {}

        @tool
        def f(color: Color, span: Span, opts: Opts, ratio: float, n: int = 1) -> str:
            """F."""
            seen.update(color=color, span=span, opts=opts, ratio=ratio, n=n)
            return "ok"

        self.assertEqual(f.parameters["properties"]["color"], {"type": "string", "enum": ["red", "blue"]})
        r = call(f, {"color": "blue", "span": {"start": 1, "end": 2}, "opts": {"depth": 3}, "ratio": 2, "n": 4.0})
        self.assertEqual(text(r), "ok", text(r))
        self.assertIs(seen["color"], Color.BLUE)
        self.assertEqual(seen["span"], {"start": 1, "end": 2})
        self.assertEqual(seen["opts"], Opts(depth=3))
        self.assertIsInstance(seen["ratio"], float)
        self.assertEqual((seen["n"], type(seen["n"])), (4, int))

    def test_per_call_classifier(self):
        @tool
        def read(path: str, write: bool = False) -> str:
            """R."""
            return ""

        @read.concurrency_safe
        def _(args):
            return not args.get("write", False)

        self.assertEqual(read.descriptor().concurrency, tools_pb2.CONCURRENCY_SAFETY_PER_CALL)
        cases = [({"path": "a"}, tools_pb2.EXECUTION_MODE_PARALLEL),
                 ({"path": "a", "write": True}, tools_pb2.EXECUTION_MODE_EXCLUSIVE),
                 ({}, tools_pb2.EXECUTION_MODE_EXCLUSIVE),  # invalid args are exclusive
                 ([], tools_pb2.EXECUTION_MODE_EXCLUSIVE)]
        for args, want in cases:
            with self.subTest(args=args):
                self.assertEqual(read.execution_mode(args), want)

        @tool
        def boom(x: str) -> str:
            """B."""
            return ""

        @boom.concurrency_safe
        def _(args):
            raise RuntimeError("classifier bug")

        self.assertEqual(boom.execution_mode({"x": "a"}), tools_pb2.EXECUTION_MODE_EXCLUSIVE)

    def test_generator_cancelled_between_chunks(self):
        ctx = ToolContext()
        closed = threading.Event()

        @tool
        def gen(ctx: ToolContext):
            """G."""
            try:
                yield "one"
                ctx.cancelled.set()  # the caller cancels while the tool is running
                yield "two"
                yield "three"
            finally:
                closed.set()
            return "never"

        outs = []
        r = call(gen, {}, ctx, outs)
        self.assertEqual([o.text for o in outs], ["one", "two"])
        self.assertTrue(closed.is_set(), "the generator was not closed")
        self.assertEqual((text(r), r.error.code), ("Error: tool call aborted", "ABORTED"))

    def test_bad_stream_item_and_meta(self):
        @tool
        def g():
            """G."""
            yield 42

        self.assertEqual(text(call(g, {})), "Error: a streaming tool yielded int; yield str or Output")

        @tool
        def m():
            """M."""
            from dsh_toolhost import Result
            return Result(content="x", meta={"n": float("nan")})

        r = call(m, {})
        self.assertTrue(r.is_error, "NaN meta must not produce invalid JSON")

    def test_invalid_blocks_become_errors(self):
        from dsh_toolhost.gen.dsh.llm.v1 import llm_pb2
        cases = [
            (llm_pb2.ContentBlock(), "Error: a tool result cannot carry an empty content block"),
            (llm_pb2.ContentBlock(reasoning=llm_pb2.ReasoningBlock(text="x")), "Error: a tool result cannot carry a reasoning content block"),
            (llm_pb2.ContentBlock(image=llm_pb2.ImageBlock(data=b"x")), "Error: an inline image block needs a mime_type"),
            (llm_pb2.ContentBlock(extension=llm_pb2.Extension(type="x", json="{")), "Error: an extension block's json is not valid JSON"),
        ]
        for block, want in cases:
            with self.subTest(want=want):
                @tool
                def t():
                    """T."""
                    return [block]
                r = call(t, {})
                self.assertEqual((text(r), r.is_error), (want, True))

    def test_definition_errors(self):
        with self.assertRaises(ValueError):
            Tool(name="t", description="", parameters={"type": "object"}, fn=lambda: None, timeout_ms=-1)
        with self.assertRaises(ValueError):
            Tool(name="t", description="", parameters={"type": "array"}, fn=lambda: None)
        with self.assertRaises(ValueError):
            Tool(name="", description="", parameters={"type": "object"}, fn=lambda: None)

    def test_exception_is_logged_with_traceback(self):
        @tool
        def explode(x: int) -> str:
            """Fails deep inside."""
            return helper_that_fails(x)

        ctx = ToolContext(call_id="call-7", session_id="s-1")
        with self.assertLogs("dsh_toolhost", "ERROR") as logs:
            r = call(explode, {"x": 3}, ctx)
        # The model sees only the message ...
        self.assertEqual((text(r), r.is_error), ("Error: no luck with 3", True))
        self.assertNotIn("Traceback", text(r))
        # ... the host's log has the tool, the call, the session and the traceback.
        self.assertEqual(len(logs.records), 1)
        line = logs.output[0]
        for want in ("explode", "call-7", "s-1", "no luck with 3", "Traceback", "helper_that_fails", "ZeroDivisionError"):
            self.assertIn(want, line)

    def test_tool_error_is_not_logged(self):
        from dsh_toolhost import ToolError

        @tool
        def typed() -> str:
            """Fails on purpose."""
            raise ToolError("not today", "NOPE")

        with self.assertNoLogs("dsh_toolhost", "ERROR"):
            r = call(typed, {})
        self.assertEqual((text(r), r.error.code), ("Error: not today", "NOPE"))

    def test_invalid_json_message(self):
        @tool
        def t(a: int = 0) -> str:
            """T."""
            return "ok"

        cases = [
            ("", "unexpected end of JSON input"),
            ('{"a":', "unexpected end of JSON input"),
            ("{} x", "unexpected data after the JSON value"),
            ('{"a" 1}', "invalid character '1' after object key"),
            ('{"a":1,}', "invalid character '}' looking for beginning of object key string"),
            ('{"a":[1 2]}', "invalid character '2' after array element"),
            ('{"a":tru}', "invalid character '}' in literal true (expecting 'e')"),
            ('{"a":"\\u12g4"}', "invalid character 'g' in \\u hexadecimal character escape"),
            ('{"a":"\x01"}', "invalid character '\\x01' in string literal"),
            ('{"a":\u00e9}', "invalid character '\u00c3' looking for beginning of value"),
            ('{"a":\u00a0}', "invalid character '\u00c2' looking for beginning of value"),
            ('[' * 10001, "invalid character '[' exceeded max depth"), ('[' * 10000, "unexpected end of JSON input"),
        ]
        for raw, want in cases:
            with self.subTest(raw=raw[:20]):
                r = run_call(t, tools_pb2.ToolExecution(call_id="c", name="t", arguments=raw), ToolContext(), lambda o: None)
                self.assertEqual(text(r), "Error: invalid arguments: arguments are not valid JSON: " + want)
                self.assertEqual(r.error.code, "INVALID_ARGS")

    def test_json_values(self):
        @tool
        def j() -> dict:
            """J."""
            return {"a": [1, 2]}

        self.assertEqual(text(call(j, {})), '{"a": [1, 2]}')
        self.assertEqual(text(call(j, "NaN")), "Error: invalid arguments: arguments are not valid JSON: invalid character 'N' looking for beginning of value")


if __name__ == "__main__":
    unittest.main()
