"""Tool definitions: the ``@tool`` decorator, raw JSON-Schema tools, the call
context a body receives, and the results and errors a body produces.

A body is a plain function. Its parameters become the JSON Schema (type hints)
and its docstring becomes the description (Google ``Args:`` or Sphinx
``:param:`` entries become per-argument descriptions). A parameter annotated
:class:`ToolContext` receives the call context instead of an argument.

A body may

* return ``str``, a content block, a list of blocks/strings/``{"type": "text"}``
  dicts, a :class:`Result` (content + meta), or any other JSON value (sent as
  JSON text);
* stream output: be a generator yielding ``str`` (stdout) or :class:`Output`
  chunks, whose ``return`` value is the result; or call ``ctx.emit(...)``;
* observe cancellation: ``ctx.cancelled`` is a :class:`threading.Event` that is
  set when the caller cancels the RPC (``ctx.check_cancelled()`` raises);
* fail: raise :class:`ToolError` (message + stable code) or any exception. The
  model then sees ``Error: <message>``; the host never dies. Any other
  exception is also logged at ERROR with its traceback on the
  ``dsh_toolhost`` logger (the tool, the call id and the session name it),
  so the host's operator sees what the model only gets the message of.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import threading
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from dsh_toolhost import schema as _schema
from dsh_toolhost.jsonsyntax import syntax_error
from dsh_toolhost.gen.dsh.llm.v1 import llm_pb2
from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2
from dsh_toolhost.views import ToolResult, text

__all__ = [
    "tool", "raw_tool", "Tool", "ToolContext", "ToolError", "Cancelled", "Result", "Output",
    "run_call", "error_result", "Concurrency",
]

log = logging.getLogger("dsh_toolhost")

Concurrency = typing.Literal["never", "always", "per_call"]
_CONCURRENCY = {
    "never": tools_pb2.CONCURRENCY_SAFETY_UNSPECIFIED,
    "always": tools_pb2.CONCURRENCY_SAFETY_ALWAYS,
    "per_call": tools_pb2.CONCURRENCY_SAFETY_PER_CALL,
}


class ToolError(Exception):
    """A typed tool failure: the model sees ``Error: <message>`` and the result
    carries ``error {name, code}``."""

    def __init__(self, message: str, code: str = "TOOL_ERROR", name: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.name = name or type(self).__name__


class Cancelled(Exception):
    """Raised by :meth:`ToolContext.check_cancelled` once the call is cancelled."""


@dataclass
class Output:
    """A chunk of live output: ``stream`` is "stdout", "stderr" or tool-defined."""

    text: str
    stream: str = "stdout"


@dataclass
class Result:
    """A result with a tool-private presentation payload (``meta``, any JSON)
    and optional error flag."""

    content: Any = ()
    meta: Any = None
    is_error: bool = False


@dataclass
class SandboxPolicy:
    """A call's confinement as the agent resolved it: mode is "read-only",
    "workspace-write", "danger-full-access" (or "" when unset); network is
    "on", "off" (or ""). A host that does not declare enforce_sandbox=True
    is not expected to enforce it, and agents refuse confined calls on it
    unless their deployment allows unenforced hosts."""

    mode: str = ""
    network: str = ""


_MODES = {1: "read-only", 2: "workspace-write", 3: "danger-full-access"}
_NETWORK = {1: "on", 2: "off"}


def sandbox_from_proto(p) -> Optional[SandboxPolicy]:
    """The SandboxPolicy of a ToolContext message (None when absent)."""
    if p is None or (p.mode == 0 and p.network == 0):
        return None
    return SandboxPolicy(mode=_MODES.get(p.mode, ""), network=_NETWORK.get(p.network, ""))


@dataclass
class ToolContext:
    """The context of one call, as the agent sent it."""

    call_id: str = ""
    tool_name: str = ""
    session_id: str = ""
    cwd: str = ""
    workspace_root: str = ""
    turn: int = 0
    step: int = 0
    sandbox: Optional[SandboxPolicy] = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    _emit: Callable[[Output], None] = field(default=lambda o: None, repr=False)

    def emit(self, text: str, stream: str = "stdout") -> None:
        """Send a chunk of live output to the caller."""
        self._emit(Output(text=text, stream=stream))

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` when the caller has cancelled the call."""
        if self.cancelled.is_set():
            raise Cancelled("tool call aborted")


class Tool:
    """One tool: its schema, its body and its presenters."""

    def __init__(self, *, name: str, description: str, parameters: dict, fn: Callable,
                 validates_arguments: bool = True, concurrency: Concurrency = "never",
                 timeout_ms: int = 0, strict: bool = False,
                 binder: Optional[Callable[[dict, ToolContext], tuple[list, dict]]] = None):
        if not name:
            raise ValueError("a tool needs a name")
        if concurrency not in _CONCURRENCY:
            raise ValueError(f"concurrency must be one of {sorted(_CONCURRENCY)}")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < 0:
            raise ValueError("timeout_ms must be a non-negative integer (0 = host default)")
        if parameters.get("type") != "object":
            raise ValueError("parameters must be a JSON Schema object")
        self.name = name
        self.description = description
        self.parameters = parameters
        self.fn = fn
        self.validates_arguments = validates_arguments
        self.concurrency = concurrency
        self.timeout_ms = timeout_ms
        self.strict = strict
        self._binder = binder or (lambda args, ctx: ([args, ctx], {}))
        self._present_call: Optional[Callable] = None
        self._present_result: Optional[Callable] = None
        self._is_concurrency_safe: Optional[Callable] = None

    def __call__(self, *a, **kw):
        return self.fn(*a, **kw)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    # Decorators for the optional callbacks.
    def present_call(self, fn: Callable[[dict], Any]) -> Callable:
        """Register the pending-card presenter ``fn(args) -> ToolCallView | None``."""
        self._present_call = fn
        return fn

    def present_result(self, fn: Callable[[dict, ToolResult], Any]) -> Callable:
        """Register the completed-card presenter ``fn(args, result) -> ToolResultView | None``."""
        self._present_result = fn
        return fn

    def concurrency_safe(self, fn: Callable[[dict], bool]) -> Callable:
        """Register the per-call classifier; only an exact ``True`` means parallel."""
        self._is_concurrency_safe = fn
        self.concurrency = "per_call"
        return fn

    def descriptor(self) -> tools_pb2.ToolDescriptor:
        return tools_pb2.ToolDescriptor(
            schema=llm_pb2.ToolSchema(name=self.name, description=self.description,
                                      parameters=json.dumps(self.parameters, separators=(",", ":")),
                                      strict=self.strict),
            concurrency=_CONCURRENCY[self.concurrency],
            timeout_ms=self.timeout_ms,
            validates_arguments=self.validates_arguments,
        )

    def _valid(self, args: Any) -> bool:
        return isinstance(args, dict) and (not self.validates_arguments or not _schema.validate(self.parameters, args))

    def execution_mode(self, args: Any) -> int:
        """The scheduling class of one call (soft: invalid args → exclusive)."""
        if self.concurrency == "always":
            return tools_pb2.EXECUTION_MODE_PARALLEL
        if self.concurrency == "per_call" and self._is_concurrency_safe and self._valid(args):
            try:
                if self._is_concurrency_safe(args) is True:
                    return tools_pb2.EXECUTION_MODE_PARALLEL
            except Exception:  # noqa: BLE001 - a throwing classifier means exclusive
                pass
        return tools_pb2.EXECUTION_MODE_EXCLUSIVE

    def call_view(self, args: Any) -> Optional[tools_pb2.ToolCallView]:
        """The pending card, or None (invalid args or a failing presenter → fallback)."""
        if not self._present_call or not self._valid(args):
            return None
        try:
            v = self._present_call(args)
        except Exception:  # noqa: BLE001 - presenters validate softly
            return None
        return v if isinstance(v, tools_pb2.ToolCallView) else None

    def result_view(self, args: Any, result: ToolResult) -> Optional[tools_pb2.ToolResultView]:
        """The completed card, or None."""
        if not self._present_result or not self._valid(args):
            return None
        try:
            v = self._present_result(args, result)
        except Exception:  # noqa: BLE001
            return None
        return v if isinstance(v, tools_pb2.ToolResultView) else None


def _is_ctx_param(p: inspect.Parameter, hints: dict) -> bool:
    hint = hints.get(p.name)
    if hint is ToolContext:
        return True
    try:
        return _schema.unwrap_optional(hint) == (ToolContext, True)
    except _schema.SchemaError:
        return False


def _convert(tp: Any, v: Any) -> Any:
    """Turn validated JSON values into the annotated dataclasses/enums."""
    if v is None:
        return None
    tp, _ = _schema.unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(v, dict):
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        return tp(**{k: _convert(hints[k], x) for k, x in v.items() if k in names})
    if isinstance(tp, type) and issubclass(tp, __import__("enum").Enum):
        return tp(v)
    if (origin is list) and isinstance(v, list) and typing.get_args(tp):
        return [_convert(typing.get_args(tp)[0], x) for x in v]
    if tp is int and isinstance(v, float):
        return int(v)
    if tp is float and isinstance(v, int):
        return float(v)
    return v


def tool(fn: Optional[Callable] = None, *, name: Optional[str] = None, description: Optional[str] = None,
         concurrency: Concurrency = "never", timeout_ms: int = 0) -> Any:
    """Define a typed tool from a function's signature and docstring.

    Usable bare (``@tool``) or with options (``@tool(concurrency="always")``).
    Parameters without a default (and not ``Optional``) are required.
    """

    def build(f: Callable) -> Tool:
        hints = typing.get_type_hints(f)
        sig = inspect.signature(f)
        desc, arg_docs = _schema.parse_docstring(f.__doc__ or "")
        props, required, params = {}, [], []
        ctx_name = None
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise _schema.SchemaError(f"{f.__name__}: *args/**kwargs are not supported")
            if _is_ctx_param(p, hints):
                ctx_name = p.name
                continue
            if p.name not in hints:
                raise _schema.SchemaError(f"{f.__name__}: parameter {p.name!r} needs a type hint")
            inner, optional = _schema.unwrap_optional(hints[p.name])
            props[p.name] = _schema.schema_for_type(inner, arg_docs.get(p.name, ""))
            if p.default is inspect.Parameter.empty and not optional:
                required.append(p.name)
            elif p.default is not inspect.Parameter.empty and p.default is not None and _schema._jsonable(p.default):
                props[p.name]["default"] = p.default
            params.append(p.name)
        parameters: dict = {"type": "object", "properties": props}
        if required:
            parameters["required"] = required

        def binder(args: dict, ctx: ToolContext) -> tuple[list, dict]:
            kw = {k: _convert(hints[k], args[k]) for k in params if k in args and args[k] is not None}
            if ctx_name:
                kw[ctx_name] = ctx
            return [], kw

        return Tool(name=name or f.__name__, description=description if description is not None else desc,
                    parameters=parameters, fn=f, concurrency=concurrency, timeout_ms=timeout_ms, binder=binder)

    return build(fn) if fn is not None else build


def raw_tool(*, name: str, description: str, parameters: dict, concurrency: Concurrency = "never",
             timeout_ms: int = 0) -> Callable[[Callable[[Any, ToolContext], Any]], Tool]:
    """Define a tool from a raw JSON Schema; the body ``fn(args, ctx)`` receives
    the parsed arguments unvalidated and must validate them itself."""

    def build(f: Callable) -> Tool:
        return Tool(name=name, description=description, parameters=parameters, fn=f,
                    validates_arguments=False, concurrency=concurrency, timeout_ms=timeout_ms)

    return build


# ---------------------------------------------------------------------------
# Running one call (transport-free): yields ToolOutput then one result.

def error_result(message: str, code: str = "", name: str = "") -> tools_pb2.ToolExecutionResult:
    """The canonical failure result: ``Error: <message>``, is_error, optional {name, code}."""
    r = tools_pb2.ToolExecutionResult(content=[text(f"Error: {message}")], is_error=True)
    if code:
        r.error.CopyFrom(tools_pb2.ToolErrorInfo(name=name, code=code))
    return r


def _check_block(b: llm_pb2.ContentBlock) -> llm_pb2.ContentBlock:
    """Refuse blocks a tool result cannot carry (the agent would reject the
    whole stream as TOOL_HOST_PROTOCOL_ERROR)."""
    kind = b.WhichOneof("block")
    if kind not in ("text", "image", "extension"):
        what = "an empty" if kind is None else "a " + kind
        raise TypeError(f"a tool result cannot carry {what} content block")
    if kind == "image":
        src = b.image.WhichOneof("source")
        if src is None or (src == "url" and not b.image.url):
            raise TypeError("an image block needs a url or data")
        if src == "data" and not b.image.mime_type:
            raise TypeError("an inline image block needs a mime_type")
    if kind == "extension":
        if not b.extension.type:
            raise TypeError("an extension block needs a type")
        try:
            json.loads(b.extension.json)
        except ValueError:
            raise TypeError("an extension block's json is not valid JSON") from None
    return b


def _to_block(v: Any) -> llm_pb2.ContentBlock:
    if isinstance(v, llm_pb2.ContentBlock):
        return _check_block(v)
    if isinstance(v, str):
        return text(v)
    if isinstance(v, dict) and v.get("type") == "text" and isinstance(v.get("text"), str):
        return text(v["text"])
    raise TypeError(f"a tool returned an unsupported content value of type {type(v).__name__}")


def _is_block_like(x: Any) -> bool:
    return isinstance(x, (str, llm_pb2.ContentBlock)) or (
        isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str))


def _content(v: Any) -> list:
    if v is None:
        return []
    if isinstance(v, (str, llm_pb2.ContentBlock)):
        return [_to_block(v)]
    if isinstance(v, (list, tuple)) and all(_is_block_like(x) for x in v):
        return [_to_block(x) for x in v]
    return [text(json.dumps(v, ensure_ascii=False))]


def _message(e: BaseException) -> str:
    msg = str(e)
    return msg if msg else type(e).__name__


def parse_arguments(raw: str) -> tuple[Any, Optional[str]]:
    """Parse the model's argument text; the error is worded as every dsh host
    words it (see :mod:`dsh_toolhost.jsonsyntax`; empty text is not JSON)."""
    bad = syntax_error(raw)
    if bad is not None:
        return None, f"arguments are not valid JSON: {bad}"
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as e:  # the scan accepted it: only nesting Python cannot hold
        return None, f"arguments are not valid JSON: {e}"


def run_call(t: Optional[Tool], execution: tools_pb2.ToolExecution, ctx: ToolContext,
             emit: Callable[[Output], None]) -> tools_pb2.ToolExecutionResult:
    """Run one call to completion on the calling thread.

    Outputs go to ``emit``; the return value is the single result. Never raises
    for tool failures (they become error results).
    """
    if t is None:
        return error_result(f'unknown tool "{execution.name}"', "UNKNOWN_TOOL", "ToolNotFoundError")
    args, err = parse_arguments(execution.arguments)
    if err is not None:
        return error_result(f"invalid arguments: {err}", "INVALID_ARGS", "ToolArgsError")
    if t.validates_arguments:
        violations = _schema.validate(t.parameters, args)
        if violations:
            return error_result("invalid arguments: " + "; ".join(violations), "INVALID_ARGS", "ToolArgsError")
    ctx._emit = emit
    try:
        if t.validates_arguments:
            a, kw = t._binder(args, ctx)
        else:
            a, kw = [args, ctx], {}
        value = t.fn(*a, **kw)
        if inspect.isgenerator(value):
            value = _drain(value, ctx, emit)
        meta, is_error = None, False
        if isinstance(value, Result):
            meta, is_error, value = value.meta, value.is_error, value.content
        result = tools_pb2.ToolExecutionResult(content=_content(value), is_error=is_error)
        if meta is not None:
            result.meta = json.dumps(meta, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ToolError as e:
        result = error_result(e.message, e.code, e.name)
        meta = None
    except Cancelled as e:
        result = error_result(_message(e) or "tool call aborted", "ABORTED", "AbortError")
        meta = None
    except Exception as e:  # noqa: BLE001 - a throwing tool fails the call, never the host
        log_failure(t.name, ctx, e)
        result = error_result(_message(e))
        meta = None
    view = t.result_view(args, ToolResult(content=list(result.content), is_error=result.is_error, meta=meta))
    if view is not None:
        result.view.CopyFrom(view)
    return result


def log_failure(tool_name: str, ctx: ToolContext, e: BaseException) -> None:
    """Log an unexpected exception of a tool body with its traceback."""
    log.error("tool %s failed (call %s, session %s): %s", tool_name, ctx.call_id or "-", ctx.session_id or "-",
              _message(e), exc_info=(type(e), e, e.__traceback__))


def _drain(gen: Iterator, ctx: ToolContext, emit: Callable[[Output], None]) -> Any:
    try:
        while True:
            if ctx.cancelled.is_set():
                gen.close()
                raise Cancelled("tool call aborted")
            item = next(gen)
            if isinstance(item, Output):
                emit(item)
            elif isinstance(item, str):
                emit(Output(text=item))
            else:
                raise TypeError(f"a streaming tool yielded {type(item).__name__}; yield str or Output")
    except StopIteration as stop:
        return stop.value
