"""Read session events from the ``DSH_EVENTS`` JetStream stream, decoded.

Debian packages no NATS client for Python, so this speaks the NATS protocol
itself — just enough for one job: an ephemeral JetStream push consumer
(``ack_policy: none``, delivered in stream order, which is seq order per
session) on a subject filter such as ``dsh.events.*.<session_id>`` (one
session) or ``dsh.events.<tenant>.>`` (a tenant). Each message is yielded as
an :class:`Event` with its headers (``Dsh-Event-Type``, ``Dsh-Seq``,
``Dsh-Session-Id``, ``Dsh-Tenant``) and the decoded ``SessionEvent`` — or
None for an event too large for the server's max_payload
(``Dsh-Event-Omitted``: fetch it with ``AgentClient.stream_events(sid,
from_seq=ev.seq, follow=False)``).

    from dsh_toolhost.events import read_events, session_subject

    for ev in read_events("nats://127.0.0.1:4222", session_subject(sid)):
        print(ev.seq, ev.type)

URLs take ``nats://`` or ``tls://`` (TLS, also used when the server requires
it) with optional ``user:password@`` or ``token@``; ``inbox_prefix`` is the
reply-inbox prefix a tenant-scoped NATS user may subscribe to
(``_INBOX_<tenant>``). A consumer that needs durable, acknowledged delivery
should use a full NATS client (``docs/events.md``).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from dataclasses import dataclass, field
from typing import Iterator, Optional
from urllib.parse import unquote, urlsplit

from dsh_toolhost.gen.dsh.session.v1 import session_pb2

__all__ = ["Event", "read_events", "session_subject", "subject_token", "STREAM"]

STREAM = "DSH_EVENTS"


def subject_token(session_id: str) -> str:
    """A session id as one subject token, escaped as the agent escapes it."""
    out = "".join(f"%{ord(c):02X}" if c <= " " or c > "~" or c in ".*>%" else c
                  for c in session_id.encode("utf-8").decode("latin-1"))
    return out or "%"


def session_subject(session_id: str, tenant: str = "*") -> str:
    """The subject filter of one session's events: of any tenant ("*", for
    an unscoped NATS user), or of ``tenant`` (what a tenant-scoped user may
    read; "" is the agent's default tenant)."""
    t = tenant if tenant == "*" else (subject_token(tenant) if tenant else "default")
    return f"dsh.events.{t}.{subject_token(session_id)}"


@dataclass
class Event:
    subject: str
    headers: dict = field(default_factory=dict)
    event: Optional[session_pb2.SessionEvent] = None  # None when omitted

    @property
    def type(self) -> str:
        return self.headers.get("Dsh-Event-Type", "")

    @property
    def seq(self) -> int:
        return int(self.headers.get("Dsh-Seq", "0"))

    @property
    def omitted(self) -> bool:
        return "Dsh-Event-Omitted" in self.headers


def read_events(url: str, subject: str, *, timeout: float = 30.0, tls: Optional[ssl.SSLContext] = None,
                inbox_prefix: str = "_INBOX") -> Iterator[Event]:
    """Yield the events on ``subject`` from the start of the stream, then
    new ones as they come; raises TimeoutError after ``timeout`` s of
    silence and ConnectionError on a protocol error."""
    u = urlsplit(url if "://" in url else "nats://" + url)
    sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 4222), timeout=timeout)
    r = sock.makefile("rb")
    info = json.loads(_line(r).split(" ", 1)[1])
    if u.scheme == "tls" or tls is not None or info.get("tls_required"):
        sock = (tls or ssl.create_default_context()).wrap_socket(sock, server_hostname=u.hostname)
        r = sock.makefile("rb")
    auth = {"user": unquote(u.username), "pass": unquote(u.password or "")} if u.password else (
        {"auth_token": unquote(u.username)} if u.username else {})
    connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1,
               "lang": "python-dsh", "version": "1", **auth}
    inbox = f"{inbox_prefix}.{os.urandom(8).hex()}"
    name = "dsh_py_" + os.urandom(6).hex()
    config = {"name": name, "deliver_subject": inbox + ".d", "filter_subject": subject, "deliver_policy": "all",
              "ack_policy": "none", "inactive_threshold": 30_000_000_000}
    body = json.dumps({"stream_name": STREAM, "config": config}).encode()
    sock.sendall(f"CONNECT {json.dumps(connect)}\r\nSUB {inbox}.r 1\r\nSUB {inbox}.d 2\r\n".encode()
                 + f"PUB $JS.API.CONSUMER.CREATE.{STREAM}.{name}.{subject} {inbox}.r {len(body)}\r\n".encode()
                 + body + b"\r\n")
    try:
        while True:
            op = _line(r)
            kind, *args = op.split(" ")
            if kind == "PING":
                sock.sendall(b"PONG\r\n")
            elif kind == "-ERR":
                raise ConnectionError(f"nats: {op[5:]}")
            elif kind in ("MSG", "HMSG"):
                subj, size = args[0], int(args[-1])
                hlen = int(args[-2]) if kind == "HMSG" else 0
                data = r.read(size + 2)[:size]
                headers, status = _headers(data[:hlen])
                if subj == inbox + ".r":
                    reply = json.loads(data[hlen:])
                    if "error" in reply:
                        raise ConnectionError(f"nats: cannot create a consumer on {STREAM} for {subject}: "
                                              f"{reply['error'].get('description')}")
                elif not status:  # status messages (heartbeats, flow control) carry no event
                    ev = None if "Dsh-Event-Omitted" in headers else session_pb2.SessionEvent.FromString(data[hlen:])
                    yield Event(subject=subj, headers=headers, event=ev)
    finally:
        sock.close()


def _line(r) -> str:
    try:
        b = r.readline()
    except socket.timeout:
        raise TimeoutError("nats: no message within the timeout") from None
    if not b:
        raise ConnectionError("nats: connection closed")
    return b.decode().rstrip("\r\n")


def _headers(block: bytes) -> tuple[dict, str]:
    lines = block.decode().split("\r\n") if block else [""]
    status = lines[0][9:].strip()  # "NATS/1.0 100 Idle Heartbeat"
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ":" in ln)}, status
