"""The conformance tools every dsh toolhost example exposes, so that one
language-neutral suite (tests/conformance, in Go) can check any host.

The tool set and its exact behaviour are specified in
tests/conformance/conformance.go; keep the two in step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Literal, Optional

from dsh_toolhost.host import ToolHost
from dsh_toolhost.tool import Output, Result, Tool, ToolContext, ToolError, tool
from dsh_toolhost.views import generic_call, generic_result, terminal_call, terminal_result

__all__ = ["conformance_tools"]


@dataclass
class EchoOpts:
    """Options of conf_echo.

    Attributes:
        flag: A required flag.
    """

    flag: bool


def conformance_tools(host: ToolHost) -> list[Tool]:
    """Build the conformance tools; conf_add_tool adds tools to ``host``."""
    lock = threading.Condition()
    status: dict[str, str] = {}
    barriers: dict[str, int] = {}

    @tool(concurrency="always")
    def conf_echo(text: str, mode: Optional[Literal["plain", "upper"]] = None,
                  tags: Optional[list[str]] = None, opts: Optional[EchoOpts] = None) -> Result:
        """Echo text back.

        Args:
            text: Text to echo back.
            mode: How to echo.
            tags: Free-form tags.
            opts: Nested options.
        """
        out = text.upper() if mode == "upper" else text
        return Result(content=out, meta={"length": len(text)})

    @conf_echo.present_call
    def _echo_call(args):
        return generic_call("echo " + args["text"], kind="other", raw_input=args["text"])

    @conf_echo.present_result
    def _echo_result(args, result):
        return generic_result("echoed " + args["text"])

    @tool
    def conf_fail(message: str) -> str:
        """Fail with the given message.

        Args:
            message: The error message.
        """
        raise RuntimeError(message)

    @tool
    def conf_slow(key: str, ms: int = 60000, ctx: ToolContext = None) -> str:
        """Sleep until cancelled or ms elapse, recording the outcome under key.

        Args:
            key: Where conf_status finds the outcome.
            ms: How long to sleep.
        """
        with lock:
            status[key] = "running"
        ctx.emit("started " + key)
        cancelled = ctx.cancelled.wait(ms / 1000.0)
        with lock:
            status[key] = "cancelled" if cancelled else "completed"
        if cancelled:
            ctx.check_cancelled()
        return "slept " + key

    @tool(concurrency="always")
    def conf_status(key: str) -> str:
        """Report what happened to the conf_slow call recorded under key.

        Args:
            key: The key given to conf_slow.
        """
        with lock:
            return status.get(key, "unknown")

    @tool
    def conf_stream(count: int):
        """Stream count chunks of output, then finish.

        Args:
            count: How many chunks.
        """
        for i in range(1, count + 1):
            yield Output(text=f"chunk {i}\n", stream="stdout")
        return f"streamed {count}"

    @conf_stream.present_call
    def _stream_call(args):
        return terminal_call(f"stream {args['count']}", description="streams chunks")

    @conf_stream.present_result
    def _stream_result(args, result):
        return terminal_result(output="".join(f"chunk {i}\n" for i in range(1, args["count"] + 1)), exit_code=0)

    @tool(concurrency="always")
    def conf_barrier(key: str, n: int) -> str:
        """Wait until n calls with the same key are running, then return.

        Args:
            key: Barrier name.
            n: Number of calls to wait for.
        """
        deadline = time.monotonic() + 10
        with lock:
            barriers[key] = barriers.get(key, 0) + 1
            lock.notify_all()
            while barriers[key] < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ToolError(f"barrier {key} timed out with {barriers[key]} of {n} calls", "BARRIER_TIMEOUT")
                lock.wait(left)
        return "released " + key

    @tool
    def conf_add_tool(name: str) -> str:
        """Add a tool named name at runtime; it returns "dynamic <name>".

        Args:
            name: The new tool's name.
        """

        def body() -> str:
            return "dynamic " + name

        t = Tool(name=name, description="A tool added at runtime.", parameters={"type": "object", "properties": {}},
                 fn=body, binder=lambda args, ctx: ([], {}))
        try:
            host.add(t)
        except ValueError as e:
            raise ToolError(str(e), "DUPLICATE_TOOL")
        return "added " + name

    return [conf_echo, conf_fail, conf_slow, conf_status, conf_stream, conf_barrier, conf_add_tool]
