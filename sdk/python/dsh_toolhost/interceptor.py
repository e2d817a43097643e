"""The ToolInterceptor side: a policy service that answers before a call
(allow / deny / ask) and after it (accept / block).

Subclass :class:`Interceptor`, override ``pre_execute`` and/or
``post_execute``, and pass an instance to ``serve(interceptor=...)``. A method
that raises answers the RPC with INTERNAL; the agent then applies its own
fail-open or fail-closed setting for this interceptor.
"""

from __future__ import annotations

from typing import Iterable, Optional

import grpc

from dsh_toolhost.gen.dsh.llm.v1 import llm_pb2
from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2, tools_pb2_grpc
from dsh_toolhost.views import text

__all__ = ["Interceptor", "InterceptorServicer", "allow", "deny", "ask", "accept", "block"]


def allow() -> tools_pb2.PreToolDecision:
    return tools_pb2.PreToolDecision(allow=tools_pb2.PreAllow())


def deny(reason: str) -> tools_pb2.PreToolDecision:
    """Refuse the call; the model sees ``Error: <reason>``."""
    return tools_pb2.PreToolDecision(deny=tools_pb2.PreDeny(reason=reason))


def ask(reason: str = "") -> tools_pb2.PreToolDecision:
    """Ask a human to approve the call."""
    return tools_pb2.PreToolDecision(ask=tools_pb2.PreAsk(reason=reason))


def _blocks(content) -> list:
    return [text(c) if isinstance(c, str) else c for c in content]


def accept(content: Optional[Iterable] = None,
           additional_contexts: Iterable[tools_pb2.HookContext] = ()) -> tools_pb2.PostToolDecision:
    """Keep the outcome; ``content`` (when given) replaces the result's content."""
    a = tools_pb2.PostAccept(additional_contexts=list(additional_contexts))
    if content is not None:
        a.replace_content = True
        a.content.extend(_blocks(content))
    return tools_pb2.PostToolDecision(accept=a)


def block(feedback: Iterable, additional_contexts: Iterable[tools_pb2.HookContext] = ()) -> tools_pb2.PostToolDecision:
    """Turn the outcome into an error carrying ``feedback``."""
    return tools_pb2.PostToolDecision(block=tools_pb2.PostBlock(
        feedback=_blocks(feedback), additional_contexts=list(additional_contexts)))


class Interceptor:
    """Base class of a remote tools/execute interceptor. The defaults allow and accept."""

    def pre_execute(self, execution: tools_pb2.ToolExecution) -> Optional[tools_pb2.PreToolDecision]:
        return None

    def post_execute(self, execution: tools_pb2.ToolExecution,
                     result: tools_pb2.ToolExecutionResult) -> Optional[tools_pb2.PostToolDecision]:
        return None


class InterceptorServicer(tools_pb2_grpc.ToolInterceptorServicer):
    """Adapts an :class:`Interceptor` to the gRPC service."""

    def __init__(self, impl: Interceptor):
        self._impl = impl

    def PreExecute(self, request, context):
        d = self._call(context, self._impl.pre_execute, request.execution)
        resp = tools_pb2.PreExecuteResponse()
        if d is not None:
            resp.decision.CopyFrom(d)
        return resp

    def PostExecute(self, request, context):
        d = self._call(context, self._impl.post_execute, request.execution, request.result)
        resp = tools_pb2.PostExecuteResponse()
        if d is not None:
            resp.decision.CopyFrom(d)
        return resp

    @staticmethod
    def _call(context, fn, *args):
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001
            context.abort(grpc.StatusCode.INTERNAL, f"interceptor failed: {e}")
