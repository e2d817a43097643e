"""The ToolHost gRPC service, the health service and ``serve()``.

# Delivery
A malformed request (no execution, no name, a missing or relative cwd, a
relative workspace root, arguments over ``max_argument_bytes``) is refused
with INVALID_ARGUMENT; everything else is a result. ``Execute`` streams zero or more ToolOutput messages and then exactly one
ToolExecutionResult. Each call runs on its own thread; when the caller cancels
the RPC the call's ``ctx.cancelled`` event is set and the stream ends without a
result (nobody is listening). ``WatchTools`` sends a full snapshot at once and
after every change, tagged with a revision that increases on every change.

# Shutdown
On SIGTERM/SIGINT (or :meth:`Server.stop`): health flips to NOT_SERVING, the
watch streams end, running calls get ``grace`` seconds to finish, then the
remaining RPCs are cancelled (their tools see ``ctx.cancelled``).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
from concurrent import futures
from typing import Iterable, Optional

import grpc

from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2, tools_pb2_grpc
from dsh_toolhost.gen.grpc.health.v1 import health_pb2, health_pb2_grpc
from dsh_toolhost.interceptor import Interceptor, InterceptorServicer
from dsh_toolhost.tool import Output, Tool, ToolContext, parse_arguments, run_call

__all__ = ["ToolHost", "Server", "serve", "HealthServicer"]

_TOOLHOST_SERVICE = "dsh.tools.v1.ToolHost"


class ToolHost(tools_pb2_grpc.ToolHostServicer):
    """A live set of tools served over gRPC. Safe for concurrent use; tools may
    be added or removed while serving (watchers get a new snapshot)."""

    def __init__(self, tools: Iterable[Tool] = (), *, max_argument_bytes: int = 1 << 20, workspace_context=None):
        """``workspace_context(cwd) -> GetWorkspaceContextResponse`` answers
        GetWorkspaceContext for a host that owns a workspace; without it the
        host owns none and answers an empty context."""
        self.max_argument_bytes = max_argument_bytes
        self.workspace_context = workspace_context
        self._lock = threading.Condition()
        self._tools: dict[str, Tool] = {}
        self._revision = 1
        self._closed = False
        for t in tools:
            self._add_locked(t)

    # Registry -----------------------------------------------------------
    def _add_locked(self, t: Tool) -> None:
        if not isinstance(t, Tool):
            raise TypeError(f"{t!r} is not a Tool; decorate it with @tool")
        if t.name in self._tools:
            raise ValueError(f"duplicate tool {t.name!r}")
        self._tools[t.name] = t

    def add(self, t: Tool) -> None:
        """Register a tool; watchers see a new snapshot."""
        with self._lock:
            self._add_locked(t)
            self._revision += 1
            self._lock.notify_all()

    def remove(self, name: str) -> bool:
        """Unregister a tool by name; returns whether it existed."""
        with self._lock:
            if self._tools.pop(name, None) is None:
                return False
            self._revision += 1
            self._lock.notify_all()
            return True

    def get(self, name: str) -> Optional[Tool]:
        with self._lock:
            return self._tools.get(name)

    def snapshot(self) -> tuple[list[tools_pb2.ToolDescriptor], int]:
        with self._lock:
            return [t.descriptor() for t in self._tools.values()], self._revision

    def close(self) -> None:
        """End every WatchTools stream (called on shutdown)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    # RPCs -----------------------------------------------------------------
    def ListTools(self, request, context):
        tools, rev = self.snapshot()
        return tools_pb2.ListToolsResponse(tools=tools, revision=rev)

    def WatchTools(self, request, context):
        wake = lambda: self._notify()  # noqa: E731
        context.add_callback(wake)
        sent = 0
        while True:
            with self._lock:
                while self._revision == sent and not self._closed and context.is_active():
                    self._lock.wait(timeout=1.0)
                if self._closed or not context.is_active():
                    return
                tools = [t.descriptor() for t in self._tools.values()]
                sent = self._revision
            yield tools_pb2.WatchToolsResponse(tools=tools, revision=sent)

    def _notify(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def GetWorkspaceContext(self, request, context):
        cwd = request.cwd
        if not cwd or not os.path.isabs(cwd):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cwd {json.dumps(cwd)} must be an absolute path")
        if self.workspace_context is None:
            return tools_pb2.GetWorkspaceContextResponse()
        return self.workspace_context(os.path.normpath(cwd))

    def PrepareCalls(self, request, context):
        out = []
        for ex in request.executions:
            t = self.get(ex.name)
            pc = tools_pb2.PreparedCall(call_id=ex.call_id, mode=tools_pb2.EXECUTION_MODE_EXCLUSIVE)
            if t is not None:
                args, err = parse_arguments(ex.arguments)
                if err is None:
                    pc.mode = t.execution_mode(args)
                    view = t.call_view(args)
                    if view is not None:
                        pc.view.CopyFrom(view)
            out.append(pc)
        return tools_pb2.PrepareCallsResponse(calls=out)

    def check_request(self, request) -> Optional[str]:
        """Why a request is malformed (→ INVALID_ARGUMENT), or None. Same
        rules and messages as the Go SDK."""
        if not request.HasField("execution"):
            return "execution is required"
        ex = request.execution
        c = ex.context
        if not ex.name:
            return "execution.name is required"
        if not c.cwd:
            return "execution.context.cwd is required: send the session's absolute working directory"
        if not os.path.isabs(c.cwd):
            return f"execution.context.cwd {json.dumps(c.cwd)} must be an absolute path"
        if c.workspace_root and not os.path.isabs(c.workspace_root):
            return f"execution.context.workspace_root {json.dumps(c.workspace_root)} must be an absolute path"
        n = len(ex.arguments.encode("utf-8", "surrogatepass"))
        if n > self.max_argument_bytes:
            return f"execution.arguments is {n} bytes, over this host's limit of {self.max_argument_bytes} bytes"
        return None

    def Execute(self, request, context):
        bad = self.check_request(request)
        if bad is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        ex = request.execution
        t = self.get(ex.name)
        c = ex.context
        ctx = ToolContext(call_id=ex.call_id, tool_name=ex.name, session_id=c.session_id, cwd=c.cwd,
                          workspace_root=c.workspace_root, turn=c.turn, step=c.step)
        events: "queue.Queue" = queue.Queue()
        done = object()

        def on_done():
            ctx.cancelled.set()
            events.put(done)

        context.add_callback(on_done)

        def body():
            try:
                result = run_call(t, ex, ctx, events.put)
            except BaseException as e:  # noqa: BLE001 - last line of defence
                from dsh_toolhost.tool import error_result
                result = error_result(str(e) or type(e).__name__)
            events.put(result)

        threading.Thread(target=body, name=f"tool-{ex.name}-{ex.call_id}", daemon=True).start()
        while True:
            item = events.get()
            if item is done:
                return
            if isinstance(item, Output):
                yield tools_pb2.ExecuteResponse(output=tools_pb2.ToolOutput(stream=item.stream, text=item.text))
                continue
            yield tools_pb2.ExecuteResponse(result=item)
            return


class HealthServicer(health_pb2_grpc.HealthServicer):
    """The standard grpc.health.v1 service (Debian ships no grpcio-health-checking)."""

    def __init__(self):
        self._lock = threading.Condition()
        self._status: dict[str, int] = {}
        self._closed = False

    def set(self, service: str, status: int) -> None:
        with self._lock:
            self._status[service] = status
            self._lock.notify_all()

    def shutdown(self) -> None:
        with self._lock:
            for k in self._status:
                self._status[k] = health_pb2.HealthCheckResponse.NOT_SERVING
            self._closed = True
            self._lock.notify_all()

    def Check(self, request, context):
        with self._lock:
            st = self._status.get(request.service)
        if st is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=st)

    def Watch(self, request, context):
        context.add_callback(lambda: self._wake())
        last = None
        while context.is_active():
            with self._lock:
                st = self._status.get(request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
                if st == last:
                    if self._closed:
                        return
                    self._lock.wait(timeout=1.0)
                    continue
            last = st
            yield health_pb2.HealthCheckResponse(status=st)

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify_all()


class Server:
    """A running host: ToolHost (+ optional ToolInterceptor) + health on one port."""

    def __init__(self, host: Optional[ToolHost] = None, *, address: str = "127.0.0.1:0",
                 interceptor: Optional[Interceptor] = None, max_workers: int = 64):
        if host is None and interceptor is None:
            raise ValueError("serve a ToolHost, an Interceptor, or both")
        self.host = host
        self.health = HealthServicer()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"))
        if host is not None:
            tools_pb2_grpc.add_ToolHostServicer_to_server(host, self._server)
            self.health.set(_TOOLHOST_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        if interceptor is not None:
            tools_pb2_grpc.add_ToolInterceptorServicer_to_server(InterceptorServicer(interceptor), self._server)
            self.health.set("dsh.tools.v1.ToolInterceptor", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        hostpart = address.rsplit(":", 1)[0]
        self.port = self._server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
        self.address = f"{hostpart}:{self.port}"
        self._stopped = threading.Event()

    def start(self) -> "Server":
        self._server.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Graceful shutdown: NOT_SERVING, end watches, drain calls for ``grace`` s."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.shutdown()
        if self.host is not None:
            self.host.close()
        self._server.stop(grace).wait()

    def wait(self) -> None:
        self._server.wait_for_termination()


def serve(tools: Iterable[Tool] = (), *, host: Optional[ToolHost] = None, address: Optional[str] = None,
          interceptor: Optional[Interceptor] = None, grace: float = 5.0) -> None:
    """Serve tools until SIGTERM/SIGINT, then shut down gracefully.

    ``address`` defaults to ``$DSH_LISTEN`` or ``127.0.0.1:0``; the bound address
    is printed on stdout as ``dsh-toolhost listening on HOST:PORT``.
    """
    if host is None and (tools or interceptor is None):
        host = ToolHost(tools)
    elif tools:
        for t in tools:
            host.add(t)
    srv = Server(host, address=address or os.environ.get("DSH_LISTEN", "127.0.0.1:0"), interceptor=interceptor)
    srv.start()
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"dsh-toolhost listening on {srv.address}", flush=True)
    while not stop.wait(timeout=3600):
        pass
    print("dsh-toolhost shutting down", file=sys.stderr, flush=True)
    srv.stop(grace)
