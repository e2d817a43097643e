"""A typed client of the agent's ``dsh.agent.v1.AgentService``: create a
session, send to it, follow its events (and, on request, the live output of
running tools), answer approvals and questions, wait until it is idle.

    from dsh_toolhost.client import AgentClient

    with AgentClient("127.0.0.1:7700") as agent:
        session = agent.create_session(cwd="/work/repo")
        sid = session.header.id
        events = agent.stream_events(sid)         # follows until closed
        agent.send(sid, "list the files")
        for resp in events:
            if resp.event.WhichOneof("payload") == "turn_end":
                break
        events.cancel()

Every method returns the generated message (``dsh_toolhost.gen.dsh.agent.v1
.agent_pb2``), so field names are those of proto/dsh/agent/v1/agent.proto.
RPC failures raise ``grpc.RpcError`` with the agent's status code and
message. ``token`` is sent as ``authorization: Bearer <token>`` (agents
started with ``--auth token`` or ``jwt``); ``root_ca``/``client_cert``/
``client_key`` (PEM file paths) turn on TLS and mTLS.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence, Union

import grpc

from dsh_toolhost.gen.dsh.agent.v1 import agent_pb2, agent_pb2_grpc
from dsh_toolhost.gen.dsh.llm.v1 import llm_pb2
from dsh_toolhost.gen.dsh.session.v1 import session_pb2

__all__ = ["AgentClient", "EventStream", "ALLOW_ONCE", "ALLOW_FOR_SESSION", "REJECT"]

ALLOW_ONCE = agent_pb2.APPROVAL_DECISION_ALLOW_ONCE
ALLOW_FOR_SESSION = agent_pb2.APPROVAL_DECISION_ALLOW_FOR_SESSION
REJECT = agent_pb2.APPROVAL_DECISION_REJECT

Content = Union[str, llm_pb2.ContentBlock, Sequence[Union[str, llm_pb2.ContentBlock]]]


def _blocks(content: Content) -> list:
    if isinstance(content, (str, llm_pb2.ContentBlock)):
        content = [content]
    return [llm_pb2.ContentBlock(text=llm_pb2.TextBlock(text=c)) if isinstance(c, str) else c for c in content]


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


class EventStream:
    """An iterator of ``StreamEventsResponse`` (``.event`` or, with
    include_progress, ``.progress``); ``cancel()`` ends it."""

    def __init__(self, call):
        self._call = call
        self._cancelled = False

    def __iter__(self) -> Iterator[agent_pb2.StreamEventsResponse]:
        return self

    def __next__(self) -> agent_pb2.StreamEventsResponse:
        try:
            return next(self._call)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and self._cancelled:
                raise StopIteration from None
            raise

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()


class AgentClient:
    """A connection to one agent (``target`` is HOST:PORT)."""

    def __init__(self, target: str, *, token: Optional[str] = None, root_ca: Optional[str] = None,
                 client_cert: Optional[str] = None, client_key: Optional[str] = None,
                 channel: Optional[grpc.Channel] = None):
        if channel is None:
            if root_ca or client_cert:
                creds = grpc.ssl_channel_credentials(_read(root_ca), _read(client_key), _read(client_cert))
                channel = grpc.secure_channel(target, creds)
            else:
                channel = grpc.insecure_channel(target)
        self.channel = channel
        self.stub = agent_pb2_grpc.AgentServiceStub(channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create_session(self, *, cwd: str, options: Optional[session_pb2.SessionOptions] = None,
                       session_id: str = "", request_id: str = "", timeout: Optional[float] = None,
                       **option_fields) -> agent_pb2.Session:
        """Create a session; ``option_fields`` (provider=..., model=...,
        workspace_root=...) fill SessionOptions when ``options`` is not given."""
        if options is None:
            options = session_pb2.SessionOptions(**option_fields)
        req = agent_pb2.CreateSessionRequest(session_id=session_id, cwd=cwd, options=options, request_id=request_id)
        return self.stub.CreateSession(req, timeout=timeout, metadata=self._metadata).session

    def get_session(self, session_id: str, *, timeout: Optional[float] = None) -> agent_pb2.Session:
        req = agent_pb2.GetSessionRequest(session_id=session_id)
        return self.stub.GetSession(req, timeout=timeout, metadata=self._metadata).session

    def send(self, session_id: str, content: Content, *, request_id: str = "",
             timeout: Optional[float] = None) -> agent_pb2.SendResponse:
        """Queue a user message (text or content blocks); returns at once."""
        req = agent_pb2.SendRequest(session_id=session_id, content=_blocks(content), request_id=request_id)
        return self.stub.Send(req, timeout=timeout, metadata=self._metadata)

    def stream_events(self, session_id: str, *, from_seq: int = 0, follow: bool = True,
                      include_progress: bool = False) -> EventStream:
        """The session's events from ``from_seq`` on; with ``follow`` the
        stream stays open for new ones. ``include_progress`` adds the live,
        non-durable output of running tools (``response.progress``)."""
        req = agent_pb2.StreamEventsRequest(session_id=session_id, from_seq=from_seq, no_follow=not follow,
                                            include_progress=include_progress)
        return EventStream(self.stub.StreamEvents(req, metadata=self._metadata))

    def respond(self, session_id: str, request_id: str, *, decision: Optional[int] = None, message: str = "",
                answers: Iterable[session_pb2.QuestionAnswer] = (), timeout: Optional[float] = None) -> int:
        """Answer a pending approval (``decision``: ALLOW_ONCE,
        ALLOW_FOR_SESSION or REJECT, with an optional message) or question
        (``answers``). Returns the seq of the event that recorded it."""
        req = agent_pb2.RespondRequest(session_id=session_id, request_id=request_id)
        if decision is not None:
            req.approval.CopyFrom(agent_pb2.ApprovalResponse(decision=decision, message=message))
        else:
            req.question.CopyFrom(agent_pb2.QuestionResponse(answers=list(answers)))
        return self.stub.Respond(req, timeout=timeout, metadata=self._metadata).seq

    def wait_idle(self, session_id: str, *, timeout: Optional[float] = None) -> agent_pb2.Session:
        """Block until the session has nothing running or queued."""
        req = agent_pb2.WaitIdleRequest(session_id=session_id)
        return self.stub.WaitIdle(req, timeout=timeout, metadata=self._metadata).session

    def cancel(self, session_id: str, *, timeout: Optional[float] = None) -> agent_pb2.CancelResponse:
        """Cancel the running turn."""
        return self.stub.Cancel(agent_pb2.CancelRequest(session_id=session_id), timeout=timeout,
                                metadata=self._metadata)
