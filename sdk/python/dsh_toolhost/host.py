"""The ToolHost gRPC service, the health service and ``serve()``.

# Delivery
A malformed request (no execution, no name, a missing or relative cwd, a
relative workspace root, arguments over ``max_argument_bytes``) is refused
with INVALID_ARGUMENT; everything else is a result. ``Execute`` streams zero or more ToolOutput messages and then exactly one
ToolExecutionResult. Each call runs on its own thread; when the caller cancels
the RPC the call's ``ctx.cancelled`` event is set and the stream ends without a
result (nobody is listening). ``WatchTools`` sends a full snapshot at once and
after every change, tagged with a revision that increases on every change.

# Transport security
``Server``/``serve()`` take the same three server options as the Go servers:
``tls_cert`` and ``tls_key`` (PEM files: TLS), and ``tls_client_ca`` (client
certificates are then required and verified: mTLS); ``serve()`` reads
``DSH_TLS_CERT``, ``DSH_TLS_KEY``, ``DSH_TLS_CLIENT_CA`` when they are not
given. Files are re-read on the next handshake after they change (rotation in
place), without dropping established connections. ``allow_peers`` (env
``DSH_ALLOW_PEER``, comma-separated) lists the URI SANs (e.g.
``spiffe://dsh/agent``) or DNS SANs a client certificate must carry; any other
client gets PERMISSION_DENIED on every RPC. A listen address that is not
loopback without TLS is refused with an error naming ``insecure``
(``DSH_INSECURE=1``), which starts it anyway with a warning.

# Environment
``serve()`` reads ``DSH_INSECURE`` as the Go servers read a boolean
variable: ``1``, ``t``, ``true``, ``yes`` or ``on`` is true; ``0``, ``f``,
``false``, ``no`` or ``off`` is false (any case; surrounding space is not trimmed, as in Go);
unset or empty is the default (false). Any other value raises
:class:`EnvError`, naming the variable, the value and the accepted forms,
before anything listens, even when the ``insecure`` argument is given: the
operator set something wrong.

# Shutdown
On SIGTERM/SIGINT (or :meth:`Server.stop`): health flips to NOT_SERVING, the
watch streams end, running calls get ``grace`` seconds to finish, then the
remaining RPCs are cancelled (their tools see ``ctx.cancelled``).
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import logging
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
from dsh_toolhost.reflection import add_reflection
from dsh_toolhost.tool import (Output, Tool, ToolContext, error_result, log_failure, parse_arguments, run_call,
                               sandbox_from_proto)

__all__ = ["ToolHost", "Server", "serve", "HealthServicer", "TLSConfigError", "EnvError"]

_TOOLHOST_SERVICE = "dsh.tools.v1.ToolHost"
_INTERCEPTOR_SERVICE = "dsh.tools.v1.ToolInterceptor"
_HEALTH_SERVICE = "grpc.health.v1.Health"


def _takes_root(hook) -> bool:
    """Whether a workspace_context hook takes the session root: it has a
    parameter named ``workspace_root`` (any kind but *args/**kwargs), which
    it is then given by name."""
    if hook is None:
        return False
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return False
    p = params.get("workspace_root")
    return p is not None and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)


def _clean_abs(path: str) -> str:
    """An absolute path normalised as Go's filepath.Clean does (os.path.normpath
    keeps a leading "//")."""
    return "/" + os.path.normpath(path).lstrip("/")


class ToolHost(tools_pb2_grpc.ToolHostServicer):
    """A live set of tools served over gRPC. Safe for concurrent use; tools may
    be added or removed while serving (watchers get a new snapshot)."""

    def __init__(self, tools: Iterable[Tool] = (), *, max_argument_bytes: int = 1 << 20,
                 enforce_sandbox: bool = False, workspace_context=None):
        """enforce_sandbox declares that these tools confine every call to its
        ToolContext.sandbox policy (SANDBOX_SUPPORT_ENFORCED); leave it off
        unless they really do. ``workspace_context(cwd) ->
        GetWorkspaceContextResponse`` answers GetWorkspaceContext for a host
        that owns a workspace; without it the host owns none and answers an
        empty context. A hook with a ``workspace_root`` parameter
        (``workspace_context(cwd, workspace_root)``, or keyword-only) gets the
        request's session root by name, normalised ("" for the host's root),
        and should read the context within it, so that a session cannot read
        another's files through its context."""
        self.max_argument_bytes = max_argument_bytes
        self.sandbox_support = tools_pb2.SANDBOX_SUPPORT_ENFORCED if enforce_sandbox else tools_pb2.SANDBOX_SUPPORT_UNSPECIFIED
        self.workspace_context = workspace_context
        self._context_takes_root = _takes_root(workspace_context)
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
        return tools_pb2.ListToolsResponse(tools=tools, revision=rev, sandbox_support=self.sandbox_support)

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
            yield tools_pb2.WatchToolsResponse(tools=tools, revision=sent, sandbox_support=self.sandbox_support)

    def _notify(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def GetWorkspaceContext(self, request, context):
        cwd = request.cwd
        if not cwd or not os.path.isabs(cwd):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cwd {json.dumps(cwd)} must be an absolute path")
        root = request.workspace_root
        if root and not os.path.isabs(root):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"workspace_root {json.dumps(root)} must be an absolute path (or empty for the host's root)")
        if self.workspace_context is None:
            return tools_pb2.GetWorkspaceContextResponse()
        if self._context_takes_root:
            return self.workspace_context(_clean_abs(cwd), workspace_root=_clean_abs(root) if root else "")
        return self.workspace_context(_clean_abs(cwd))

    def EndSession(self, request, context):
        """This host holds nothing per session: ending one is a no-op once
        the request names a session."""
        if not request.session_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id is required")
        return tools_pb2.EndSessionResponse(tasks_stopped=0)

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

    def PrepareExecute(self, request_iterator, context):
        # Not served: UNIMPLEMENTED (without the generated stub's logged
        # NotImplementedError); the agent then uses PrepareCalls and Execute.
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "PrepareExecute is not served by this host: use PrepareCalls and Execute")

    def Execute(self, request, context):
        bad = self.check_request(request)
        if bad is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        ex = request.execution
        t = self.get(ex.name)
        c = ex.context
        ctx = ToolContext(call_id=ex.call_id, tool_name=ex.name, session_id=c.session_id, cwd=c.cwd,
                          workspace_root=c.workspace_root, turn=c.turn, step=c.step,
                          sandbox=sandbox_from_proto(c.sandbox if c.HasField("sandbox") else None))
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
                log_failure(ex.name, ctx, e)
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


class TLSConfigError(ValueError):
    """A transport-security option that cannot work; the message names it."""


class EnvError(ValueError):
    """An environment variable whose value does not parse; ``serve()`` raises
    it before anything listens. The message has the Go servers' shape:
    ``NAME="VALUE": REASON`` (the reason gives the accepted forms and the
    default; the value is quoted as a JSON string, which is Go's %q for
    printable text)."""

    def __init__(self, variable: str, value: str, reason: str):
        super().__init__(f"{variable}={json.dumps(value, ensure_ascii=False)}: {reason}")
        self.variable = variable
        self.value = value
        self.reason = reason


_TRUE = frozenset(("1", "t", "true", "yes", "on"))
_FALSE = frozenset(("0", "f", "false", "no", "off"))


def _env_bool(name: str, default: bool) -> bool:
    """The boolean in environment variable ``name``: 1, t, true, yes or on;
    0, f, false, no or off (any case; surrounding space is not trimmed, as in Go); unset or
    empty gives ``default``; anything else raises :class:`EnvError`."""
    value = os.environ.get(name, "")
    v = value.lower()
    if not v:
        return default
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise EnvError(name, value, "not a boolean (true or false; also 1 or 0, yes or no, on or off); "
                                f"unset means {str(default).lower()}")


def is_loopback(address: str) -> bool:
    """Whether a listen address (HOST:PORT, [V6]:PORT, unix:PATH) stays on this machine."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TLSConfigError(f"{option} {path!r}: {e.strerror}") from e


class _ReloadingCredentials:
    """Server credentials whose files are re-read at the next handshake after
    one of them changed (grpc's dynamic credentials); established connections
    keep their session."""

    def __init__(self, cert: str, key: str, client_ca: Optional[str]):
        self.files = [(cert, "tls_cert"), (key, "tls_key")] + ([(client_ca, "tls_client_ca")] if client_ca else [])
        self.client_ca = client_ca
        self.stamp = self._stamp()
        initial = self._config()
        self.credentials = grpc.dynamic_ssl_server_credentials(
            initial, self._fetch, require_client_authentication=bool(client_ca))

    def _stamp(self):
        out = []
        for path, _ in self.files:
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return out

    def _config(self):
        cert, key = _read(self.files[0][0], "tls_cert"), _read(self.files[1][0], "tls_key")
        ca = _read(self.client_ca, "tls_client_ca") if self.client_ca else None
        if b"-----BEGIN" not in cert or b"-----BEGIN" not in key or (ca is not None and b"-----BEGIN" not in ca):
            raise TLSConfigError("tls_cert, tls_key and tls_client_ca must be PEM files")
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def _fetch(self):
        stamp = self._stamp()
        if stamp == self.stamp:
            return None
        try:
            cfg = self._config()
        except TLSConfigError as e:  # half-written files: keep serving the old ones
            print(f"dsh-toolhost: keeping the old certificate: {e}", file=sys.stderr, flush=True)
            return None
        self.stamp = stamp
        return cfg


def _peer_ids(context) -> list[str]:
    auth = context.auth_context() or {}
    return [v.decode() for k in ("peer_uri", "peer_dns") for v in auth.get(k, [])]


class _AllowPeers(grpc.ServerInterceptor):
    """PERMISSION_DENIED for a client certificate without an allowed URI or DNS SAN."""

    def __init__(self, allowed: Iterable[str]):
        self.allowed = frozenset(allowed)

    def _check(self, context) -> None:
        ids = _peer_ids(context)
        if not self.allowed.intersection(ids):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"client certificate identities {ids or ['(none)']} are not among the allowed peers")

    _KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler, False),
              ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
              ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
              ("stream_stream", grpc.stream_stream_rpc_method_handler, True))

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:
            return None
        check = self._check
        for attr, make, streams in self._KINDS:
            inner = getattr(handler, attr)
            if inner is None:
                continue
            if streams:
                def wrapped(request, context, inner=inner):
                    check(context)
                    yield from inner(request, context)
            else:
                def wrapped(request, context, inner=inner):
                    check(context)
                    return inner(request, context)
            return make(wrapped, handler.request_deserializer, handler.response_serializer)
        return handler


class Server:
    """A running host: ToolHost (+ optional ToolInterceptor) + health + server
    reflection (v1 and v1alpha, for grpcurl) on one port.

    ``tls_cert``/``tls_key`` serve TLS; ``tls_client_ca`` requires client
    certificates from that CA (mTLS); ``allow_peers`` limits callers to
    certificates with one of those URI or DNS SANs. A non-loopback address
    without TLS raises :class:`TLSConfigError` unless ``insecure``.
    """

    def __init__(self, host: Optional[ToolHost] = None, *, address: str = "127.0.0.1:0",
                 interceptor: Optional[Interceptor] = None, max_workers: int = 64,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_client_ca: Optional[str] = None, allow_peers: Iterable[str] = (),
                 insecure: bool = False):
        if host is None and interceptor is None:
            raise ValueError("serve a ToolHost, an Interceptor, or both")
        allow_peers = [p for p in allow_peers if p]
        if bool(tls_cert) != bool(tls_key):
            raise TLSConfigError("tls_cert and tls_key go together (DSH_TLS_CERT, DSH_TLS_KEY)")
        if tls_client_ca and not tls_cert:
            raise TLSConfigError("tls_client_ca needs tls_cert and tls_key: client certificates are checked over TLS")
        if allow_peers and not tls_client_ca:
            raise TLSConfigError("allow_peers needs tls_client_ca (DSH_TLS_CLIENT_CA): "
                                 "without client certificates there is no identity to check")
        if not tls_cert and not is_loopback(address):
            if not insecure:
                raise TLSConfigError(f"refusing to listen on {address} without TLS: give tls_cert and tls_key "
                                     "(DSH_TLS_CERT, DSH_TLS_KEY), or set insecure (DSH_INSECURE=1) to serve plaintext")
            print(f"WARN dsh-toolhost: insecure: serving plaintext on {address}; anyone who reaches it can run its tools",
                  file=sys.stderr, flush=True)
        creds = _ReloadingCredentials(tls_cert, tls_key, tls_client_ca).credentials if tls_cert else None
        self.host = host
        self.health = HealthServicer()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                                   interceptors=[_AllowPeers(allow_peers)] if allow_peers else None)
        if host is not None:
            tools_pb2_grpc.add_ToolHostServicer_to_server(host, self._server)
            self.health.set(_TOOLHOST_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        if interceptor is not None:
            tools_pb2_grpc.add_ToolInterceptorServicer_to_server(InterceptorServicer(interceptor), self._server)
            self.health.set(_INTERCEPTOR_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        services = [n for n in (_TOOLHOST_SERVICE if host is not None else None,
                                _INTERCEPTOR_SERVICE if interceptor is not None else None) if n]
        add_reflection(self._server, services + [_HEALTH_SERVICE])
        hostpart = address.rsplit(":", 1)[0]
        if creds is not None:
            self.port = self._server.add_secure_port(address, creds)
        else:
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
          interceptor: Optional[Interceptor] = None, grace: float = 5.0,
          tls_cert: Optional[str] = None, tls_key: Optional[str] = None, tls_client_ca: Optional[str] = None,
          allow_peers: Optional[Iterable[str]] = None, insecure: Optional[bool] = None) -> None:
    """Serve tools until SIGTERM/SIGINT, then shut down gracefully.

    ``address`` defaults to ``$DSH_LISTEN`` or ``127.0.0.1:0``; the bound address
    is printed on stdout as ``dsh-toolhost listening on HOST:PORT``. The TLS
    options default to ``$DSH_TLS_CERT``, ``$DSH_TLS_KEY``, ``$DSH_TLS_CLIENT_CA``,
    ``$DSH_ALLOW_PEER`` (comma-separated) and ``$DSH_INSECURE`` (see Server):
    true is 1, t, true, yes or on, false is 0, f, false, no or off (any case; surrounding
    space is not trimmed, as in Go), unset or empty is false. Any other value of
    ``$DSH_INSECURE`` raises :class:`EnvError` (naming the variable, the value
    and the accepted forms) before anything listens, even when ``insecure`` is
    given, which otherwise wins over the variable.
    When the program configured no logging, log records (a tool's exception
    with its traceback) go to stderr.
    """
    env_insecure = _env_bool("DSH_INSECURE", False)  # first: a malformed value is refused even if insecure is given
    if not logging.getLogger().handlers:  # the program set up no logging: failures go to stderr
        logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env = os.environ.get
    if allow_peers is None:
        allow_peers = [p.strip() for p in env("DSH_ALLOW_PEER", "").split(",") if p.strip()]
    if insecure is None:
        insecure = env_insecure
    if host is None and (tools or interceptor is None):
        host = ToolHost(tools)
    elif tools:
        for t in tools:
            host.add(t)
    srv = Server(host, address=address or env("DSH_LISTEN", "127.0.0.1:0"), interceptor=interceptor,
                 tls_cert=tls_cert or env("DSH_TLS_CERT"), tls_key=tls_key or env("DSH_TLS_KEY"),
                 tls_client_ca=tls_client_ca or env("DSH_TLS_CLIENT_CA"), allow_peers=allow_peers, insecure=insecure)
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
