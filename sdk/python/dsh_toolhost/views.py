"""Presentation views (semantics §6.6): helpers building the ToolCallView and
ToolResultView cards a tool's presenters return.

Presenters are pure: they receive the (validated) arguments and, for results,
a :class:`ToolResult`; they must not touch the world, because a UI calls them
again on replay. Returning ``None`` selects the generic fallback card.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from dsh_toolhost.gen.dsh.llm.v1 import llm_pb2
from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2

__all__ = [
    "ToolResult", "text", "image", "generic_call", "terminal_call", "diff_call",
    "generic_result", "terminal_result", "diff_result", "location", "file_diff",
]

_KINDS = {
    None: tools_pb2.TOOL_CALL_KIND_UNSPECIFIED, "read": tools_pb2.TOOL_CALL_KIND_READ,
    "edit": tools_pb2.TOOL_CALL_KIND_EDIT, "delete": tools_pb2.TOOL_CALL_KIND_DELETE,
    "move": tools_pb2.TOOL_CALL_KIND_MOVE, "search": tools_pb2.TOOL_CALL_KIND_SEARCH,
    "execute": tools_pb2.TOOL_CALL_KIND_EXECUTE, "fetch": tools_pb2.TOOL_CALL_KIND_FETCH,
    "other": tools_pb2.TOOL_CALL_KIND_OTHER,
}


@dataclass(frozen=True)
class ToolResult:
    """What a result presenter receives: the model-facing outcome of the call."""

    content: Sequence[llm_pb2.ContentBlock]
    is_error: bool
    meta: Any = None

    @property
    def text(self) -> str:
        """The concatenated text of the text blocks."""
        return "".join(b.text.text for b in self.content if b.WhichOneof("block") == "text")


def text(s: str) -> llm_pb2.ContentBlock:
    """A text content block."""
    return llm_pb2.ContentBlock(text=llm_pb2.TextBlock(text=s))


def image(*, data: Optional[bytes] = None, url: Optional[str] = None, mime_type: str = "") -> llm_pb2.ContentBlock:
    """An image content block from inline bytes (mime_type required) or a URL."""
    if (data is None) == (url is None):
        raise ValueError("image needs exactly one of data or url")
    if data is not None:
        if not mime_type:
            raise ValueError("inline image data needs a mime_type")
        return llm_pb2.ContentBlock(image=llm_pb2.ImageBlock(data=data, mime_type=mime_type))
    return llm_pb2.ContentBlock(image=llm_pb2.ImageBlock(url=url, mime_type=mime_type))


def location(path: str, line: Optional[int] = None) -> tools_pb2.FileLocation:
    """A file a call reads or modifies."""
    loc = tools_pb2.FileLocation(path=path)
    if line is not None:
        loc.line = line
    return loc


def file_diff(path: str, old_text: Optional[str], new_text: str) -> tools_pb2.FileDiff:
    """One changed file or hunk; old_text None means a new file."""
    d = tools_pb2.FileDiff(path=path, new_text=new_text)
    if old_text is not None:
        d.old_text = old_text
    return d


def _blocks(content: Optional[Iterable]) -> list:
    return [text(c) if isinstance(c, str) else c for c in (content or ())]


def generic_call(title: str, *, kind: Optional[str] = None, raw_input: str = "",
                 content: Optional[Iterable] = None,
                 locations: Optional[Iterable[tools_pb2.FileLocation]] = None) -> tools_pb2.ToolCallView:
    """The default pending card; kind is read|edit|delete|move|search|execute|fetch|other."""
    if kind not in _KINDS:
        raise ValueError(f"unknown tool call kind {kind!r}")
    return tools_pb2.ToolCallView(generic=tools_pb2.GenericCallView(
        title=title, kind=_KINDS[kind], raw_input=raw_input, content=_blocks(content),
        locations=list(locations or ())))


def terminal_call(title: str, *, description: str = "", cwd: str = "") -> tools_pb2.ToolCallView:
    """A shell command card: the command is the title."""
    return tools_pb2.ToolCallView(terminal=tools_pb2.TerminalCallView(title=title, description=description, cwd=cwd))


def diff_call(title: str, diffs: Iterable[tools_pb2.FileDiff],
              locations: Optional[Iterable[tools_pb2.FileLocation]] = None) -> tools_pb2.ToolCallView:
    """A file mutation card with whole-snippet diffs."""
    return tools_pb2.ToolCallView(diff=tools_pb2.DiffCallView(title=title, diffs=list(diffs), locations=list(locations or ())))


def generic_result(title: str = "", content: Optional[Iterable] = None) -> tools_pb2.ToolResultView:
    """The default completed card: a replacement title and reformatted content."""
    return tools_pb2.ToolResultView(generic=tools_pb2.GenericResultView(title=title, content=_blocks(content)))


def terminal_result(title: str = "", *, output: str = "", exit_code: Optional[int] = None,
                    signal: str = "") -> tools_pb2.ToolResultView:
    """A terminal run's captured output and exit status."""
    v = tools_pb2.TerminalResultView(title=title, output=output, signal=signal)
    if exit_code is not None:
        v.exit_code = exit_code
    return tools_pb2.ToolResultView(terminal=v)


def diff_result(title: str = "", diffs: Iterable[tools_pb2.FileDiff] = ()) -> tools_pb2.ToolResultView:
    """A completed file mutation as applied hunks."""
    return tools_pb2.ToolResultView(diff=tools_pb2.DiffResultView(title=title, diffs=list(diffs)))
