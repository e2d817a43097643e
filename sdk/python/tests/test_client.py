import os
import sys
import threading
import unittest
from concurrent import futures

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dsh_toolhost.client import ALLOW_FOR_SESSION, AgentClient  # noqa: E402
from dsh_toolhost.events import session_subject, subject_token  # noqa: E402
from dsh_toolhost.gen.dsh.agent.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402
from dsh_toolhost.gen.dsh.session.v1 import session_pb2  # noqa: E402


class FakeAgent(agent_pb2_grpc.AgentServiceServicer):
    """Records what the client sent; the agent is the client's upstream."""

    def __init__(self):
        self.requests, self.auth = [], []
        self.streaming = threading.Event()

    def _seen(self, req, context):
        self.requests.append(req)
        self.auth.append(dict(context.invocation_metadata()).get("authorization"))

    def CreateSession(self, req, context):
        self._seen(req, context)
        return agent_pb2.CreateSessionResponse(session=agent_pb2.Session(
            header=session_pb2.SessionHeader(id="s-1", cwd=req.cwd)))

    def Send(self, req, context):
        self._seen(req, context)
        return agent_pb2.SendResponse(status=agent_pb2.AGENT_STATUS_RUNNING)

    def StreamEvents(self, req, context):
        self._seen(req, context)
        yield agent_pb2.StreamEventsResponse(event=session_pb2.SessionEvent(seq=7, turn_end=session_pb2.TurnEnd(turn=1)))
        yield agent_pb2.StreamEventsResponse(progress=agent_pb2.ToolProgress(tool_name="bash", after_seq=7))
        done = threading.Event()
        context.add_callback(done.set)
        self.streaming.set()
        done.wait(10)  # follows until the client cancels

    def Respond(self, req, context):
        self._seen(req, context)
        return agent_pb2.RespondResponse(seq=42)

    def WaitIdle(self, req, context):
        self._seen(req, context)
        return agent_pb2.WaitIdleResponse(session=agent_pb2.Session(status=agent_pb2.AGENT_STATUS_IDLE))


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeAgent()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        agent_pb2_grpc.add_AgentServiceServicer_to_server(self.fake, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.client = AgentClient(f"127.0.0.1:{port}", token="t0k")

    def tearDown(self):
        self.client.close()
        self.server.stop(0)

    def test_calls_carry_the_right_requests_and_token(self):
        c = self.client
        s = c.create_session(cwd="/w", provider="scripted", model="m1")
        self.assertEqual(s.header.id, "s-1")
        self.assertEqual(c.send("s-1", "hi").status, agent_pb2.AGENT_STATUS_RUNNING)
        self.assertEqual(c.respond("s-1", "ap-1", decision=ALLOW_FOR_SESSION, message="ok"), 42)
        answer = session_pb2.QuestionAnswer(id="q1", selected=["yes"])
        c.respond("s-1", "q-1", answers=[answer])
        self.assertEqual(c.wait_idle("s-1").status, agent_pb2.AGENT_STATUS_IDLE)
        create, send, approval, question, idle = self.fake.requests
        self.assertEqual((create.cwd, create.options.provider, create.options.model), ("/w", "scripted", "m1"))
        self.assertEqual([b.text.text for b in send.content], ["hi"])
        self.assertEqual((approval.WhichOneof("answer"), approval.approval.decision, approval.approval.message),
                         ("approval", agent_pb2.APPROVAL_DECISION_ALLOW_FOR_SESSION, "ok"))
        self.assertEqual((question.WhichOneof("answer"), list(question.question.answers)), ("question", [answer]))
        self.assertEqual(idle.session_id, "s-1")
        self.assertEqual(self.fake.auth, ["Bearer t0k"] * 5)

    def test_stream_events_follows_until_cancelled(self):
        stream = self.client.stream_events("s-1", from_seq=3, include_progress=True)
        got = []
        for resp in stream:
            got.append("progress" if resp.HasField("progress") else "event")
            if len(got) == 2:
                self.assertTrue(self.fake.streaming.wait(5))
                stream.cancel()  # ends the loop quietly
        self.assertEqual(got, ["event", "progress"])
        req = self.fake.requests[0]
        self.assertEqual((req.session_id, req.from_seq, req.no_follow, req.include_progress), ("s-1", 3, False, True))


class SubjectTokenTest(unittest.TestCase):
    def test_escapes_as_the_agent_does(self):
        # internal/events.SubjectToken: bytes <= ' ', > '~', and . * > % become %XX.
        for sid, want in [("0123abc-_", "0123abc-_"), ("a.b", "a%2Eb"), ("*>", "%2A%3E"), ("50%", "50%25"),
                          ("a b", "a%20b"), ("é", "%C3%A9"), ("~\x7f", "~%7F"), ("", "%")]:
            self.assertEqual(subject_token(sid), want, sid)
        self.assertEqual(session_subject("a.b"), "dsh.events.*.a%2Eb")
        self.assertEqual(session_subject("s1", tenant="ac.me"), "dsh.events.ac%2Eme.s1")
        self.assertEqual(session_subject("s1", tenant=""), "dsh.events.default.s1")


if __name__ == "__main__":
    unittest.main()
