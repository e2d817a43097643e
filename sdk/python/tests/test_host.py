import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dsh_toolhost import (Interceptor, Output, Result, SandboxPolicy, Server, ToolContext, ToolError, ToolHost, allow,  # noqa: E402
                          block, deny, generic_call, raw_tool, tool)
from dsh_toolhost.conformance import conformance_tools  # noqa: E402
from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2, tools_pb2_grpc  # noqa: E402
from dsh_toolhost.gen.grpc.health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def call(name, args, cid="c1"):
    return tools_pb2.ExecuteRequest(execution=tools_pb2.ToolExecution(
        call_id=cid, name=name, arguments=args if isinstance(args, str) else json.dumps(args),
        context=tools_pb2.ToolContext(session_id="s1", cwd="/tmp")))


def text_of(result):
    return "".join(b.text.text for b in result.content)


def poll(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


@tool
def boom(x: int) -> str:
    """Raise.

    Args:
        x: Anything.
    """
    raise ValueError(f"bad x {x}")


@tool
def typed_fail() -> str:
    """Raise a typed error."""
    raise ToolError("no such thing", "FS_NOT_FOUND", "FsError")


@tool
def emitter(ctx: ToolContext) -> str:
    """Emit then return."""
    ctx.emit("out\n")
    ctx.emit("err\n", stream="stderr")
    return "done"


@tool
def bad_return() -> object:
    """Return something that is not content."""
    return {1, 2}


@raw_tool(name="raw", description="Raw.", parameters={"type": "object", "properties": {"a": {"type": "string"}}})
def raw(args, ctx):
    return json.dumps(args, sort_keys=True)


class HostTest(unittest.TestCase):
    def setUp(self):
        self.host = ToolHost([boom, typed_fail, emitter, bad_return, raw])
        for t in conformance_tools(self.host):
            self.host.add(t)
        self.srv = Server(self.host).start()
        self.ch = grpc.insecure_channel(self.srv.address)
        self.stub = tools_pb2_grpc.ToolHostStub(self.ch)

    def tearDown(self):
        self.ch.close()
        self.srv.stop(0.5)

    def run_call(self, name, args):
        msgs = list(self.stub.Execute(call(name, args), timeout=10))
        self.assertTrue(msgs and msgs[-1].WhichOneof("event") == "result", msgs)
        self.assertEqual([m.WhichOneof("event") for m in msgs[:-1]], ["output"] * (len(msgs) - 1))
        return [m.output for m in msgs[:-1]], msgs[-1].result

    def test_sandbox_policy_and_support(self):
        # Hosts declare no enforcement by default; a tool sees the call's policy.
        self.assertEqual(self.stub.ListTools(tools_pb2.ListToolsRequest()).sandbox_support,
                         tools_pb2.SANDBOX_SUPPORT_UNSPECIFIED)
        seen = []

        @tool
        def policy_probe(ctx: ToolContext) -> str:
            """Report the sandbox policy."""
            seen.append(ctx.sandbox)
            return "ok"
        self.host.add(policy_probe)
        req = call("policy_probe", {})
        req.execution.context.sandbox.mode = tools_pb2.SANDBOX_MODE_READ_ONLY
        req.execution.context.sandbox.network = tools_pb2.NETWORK_ACCESS_OFF
        list(self.stub.Execute(req, timeout=10))
        list(self.stub.Execute(call("policy_probe", {}), timeout=10))
        self.assertEqual(seen, [SandboxPolicy(mode="read-only", network="off"), None])
        enforcing = ToolHost([], enforce_sandbox=True)
        self.assertEqual(enforcing.ListTools(tools_pb2.ListToolsRequest(), None).sandbox_support,
                         tools_pb2.SANDBOX_SUPPORT_ENFORCED)

    def test_list_and_schema(self):
        resp = self.stub.ListTools(tools_pb2.ListToolsRequest())
        names = [t.schema.name for t in resp.tools]
        self.assertIn("conf_echo", names)
        echo = next(t for t in resp.tools if t.schema.name == "conf_echo")
        self.assertEqual(echo.concurrency, tools_pb2.CONCURRENCY_SAFETY_ALWAYS)
        params = json.loads(echo.schema.parameters)
        self.assertEqual(params["required"], ["text"])
        self.assertEqual(params["properties"]["opts"]["required"], ["flag"])
        self.assertFalse(next(t for t in resp.tools if t.schema.name == "raw").validates_arguments)

    def test_results(self):
        cases = [
            ("echo", "conf_echo", {"text": "hi", "mode": "upper"}, "HI", False, None),
            ("invalid", "conf_echo", {"mode": "x", "opts": {}},
             'Error: invalid arguments: missing required property "text"; "mode" must be one of [plain, upper]; '
             'missing required property "opts.flag"', True, ("ToolArgsError", "INVALID_ARGS")),
            ("not json", "conf_echo", "{", None, True, ("ToolArgsError", "INVALID_ARGS")),
            ("not object", "conf_echo", "[]", 'Error: invalid arguments: "arguments" must be an object', True,
             ("ToolArgsError", "INVALID_ARGS")),
            ("unknown", "nope", {}, 'Error: unknown tool "nope"', True, ("ToolNotFoundError", "UNKNOWN_TOOL")),
            ("throws", "boom", {"x": 2}, "Error: bad x 2", True, None),
            ("typed error", "typed_fail", {}, "Error: no such thing", True, ("FsError", "FS_NOT_FOUND")),
            ("bad return", "bad_return", {}, None, True, None),
            ("raw unvalidated", "raw", {"a": 1}, '{"a": 1}', False, None),
        ]
        for name, tool_name, args, want_text, is_error, err in cases:
            with self.subTest(name):
                _, r = self.run_call(tool_name, args)
                if want_text is not None:
                    self.assertEqual(text_of(r), want_text)
                else:
                    self.assertTrue(text_of(r).startswith("Error: "), text_of(r))
                self.assertEqual(r.is_error, is_error)
                if err:
                    self.assertEqual((r.error.name, r.error.code), err)
                else:
                    self.assertFalse(r.HasField("error"))

    def test_meta_and_views(self):
        _, r = self.run_call("conf_echo", {"text": "abc"})
        self.assertEqual(json.loads(r.meta), {"length": 3})
        self.assertEqual(r.view.generic.title, "echoed abc")
        prep = self.stub.PrepareCalls(tools_pb2.PrepareCallsRequest(executions=[
            call("conf_echo", {"text": "a"}, "1").execution, call("conf_echo", {}, "2").execution,
            call("conf_slow", {"key": "k"}, "3").execution, call("nope", {}, "4").execution,
            call("conf_stream", {"count": 2}, "5").execution]))
        self.assertEqual([c.call_id for c in prep.calls], ["1", "2", "3", "4", "5"])
        self.assertEqual(prep.calls[0].mode, tools_pb2.EXECUTION_MODE_PARALLEL)
        self.assertEqual(prep.calls[0].view.generic.title, "echo a")
        self.assertFalse(prep.calls[1].HasField("view"))
        self.assertEqual(prep.calls[2].mode, tools_pb2.EXECUTION_MODE_EXCLUSIVE)
        self.assertEqual(prep.calls[3].mode, tools_pb2.EXECUTION_MODE_EXCLUSIVE)
        self.assertEqual(prep.calls[4].view.terminal.title, "stream 2")

    def test_end_session(self):
        r = self.stub.EndSession(tools_pb2.EndSessionRequest(session_id="s1"))
        self.assertEqual(r.tasks_stopped, 0)
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.EndSession(tools_pb2.EndSessionRequest())
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("session_id", cm.exception.details())

    def test_streaming(self):
        outs, r = self.run_call("conf_stream", {"count": 3})
        self.assertEqual([o.text for o in outs], ["chunk 1\n", "chunk 2\n", "chunk 3\n"])
        self.assertEqual(text_of(r), "streamed 3")
        self.assertEqual(r.view.terminal.output, "chunk 1\nchunk 2\nchunk 3\n")
        self.assertEqual(r.view.terminal.exit_code, 0)
        outs, r = self.run_call("emitter", {})
        self.assertEqual([(o.stream, o.text) for o in outs], [("stdout", "out\n"), ("stderr", "err\n")])

    def test_cancellation_reaches_tool(self):
        it = self.stub.Execute(call("conf_slow", {"key": "k1"}))
        first = next(it)
        self.assertEqual(first.output.text, "started k1")
        it.cancel()
        self.assertTrue(poll(lambda: text_of(self.run_call("conf_status", {"key": "k1"})[1]) == "cancelled"))

    def test_concurrent_calls(self):
        results = [None] * 4

        def run(i):
            results[i] = text_of(self.run_call("conf_barrier", {"key": "b", "n": 4})[1])

        ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(15)
        self.assertEqual(results, ["released b"] * 4)

    def test_watch_after_add(self):
        w = self.stub.WatchTools(tools_pb2.WatchToolsRequest())
        first = next(w)
        self.assertNotIn("conf_dyn_x", [t.schema.name for t in first.tools])
        _, r = self.run_call("conf_add_tool", {"name": "conf_dyn_x"})
        self.assertEqual(text_of(r), "added conf_dyn_x")
        second = next(w)
        self.assertGreater(second.revision, first.revision)
        self.assertIn("conf_dyn_x", [t.schema.name for t in second.tools])
        self.assertEqual(text_of(self.run_call("conf_dyn_x", {})[1]), "dynamic conf_dyn_x")
        w.cancel()

    def test_malformed_requests(self):
        cases = {
            "no execution": tools_pb2.ExecuteRequest(),
            "no cwd": tools_pb2.ExecuteRequest(execution=tools_pb2.ToolExecution(name="conf_echo", arguments="{}")),
            "relative cwd": tools_pb2.ExecuteRequest(execution=tools_pb2.ToolExecution(
                name="conf_echo", arguments="{}", context=tools_pb2.ToolContext(cwd="rel"))),
            "relative root": tools_pb2.ExecuteRequest(execution=tools_pb2.ToolExecution(
                name="conf_echo", arguments="{}", context=tools_pb2.ToolContext(cwd="/", workspace_root="ws"))),
            "too big": call("conf_echo", '{"text":"' + "x" * (1 << 20) + '"}'),
        }
        for name, req in cases.items():
            with self.subTest(name):
                with self.assertRaises(grpc.RpcError) as e:
                    list(self.stub.Execute(req, timeout=10))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())

    def test_prepare_execute_unimplemented(self):
        # The host does not serve PrepareExecute: UNIMPLEMENTED with its own
        # message (not the generated stub's), so the agent falls back to
        # PrepareCalls and Execute; the tool does not run.
        ex = call("conf_echo", {"text": "hi"}).execution
        msgs = [tools_pb2.PrepareExecuteRequest(prepare=tools_pb2.PrepareCallsRequest(executions=[ex])),
                tools_pb2.PrepareExecuteRequest(execute=tools_pb2.ExecuteRequest(execution=ex))]
        with self.assertRaises(grpc.RpcError) as e:
            list(self.stub.PrepareExecute(iter(msgs), timeout=10))
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED, e.exception.details())
        self.assertEqual(e.exception.details(), "PrepareExecute is not served by this host: use PrepareCalls and Execute")

    def test_health(self):
        h = health_pb2_grpc.HealthStub(self.ch)
        for svc in ("", "dsh.tools.v1.ToolHost"):
            self.assertEqual(h.Check(health_pb2.HealthCheckRequest(service=svc)).status,
                             health_pb2.HealthCheckResponse.SERVING)
        with self.assertRaises(grpc.RpcError) as e:
            h.Check(health_pb2.HealthCheckRequest(service="nope"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)


class Policy(Interceptor):
    def pre_execute(self, execution):
        if "rm -rf" in execution.arguments:
            return deny("destructive command")
        return allow()

    def post_execute(self, execution, result):
        if "secret" in "".join(b.text.text for b in result.content):
            return block(["redacted: the output contained a secret"])
        return None


class InterceptorTest(unittest.TestCase):
    def test_decisions(self):
        srv = Server(interceptor=Policy()).start()
        self.addCleanup(srv.stop, 0.5)
        ch = grpc.insecure_channel(srv.address)
        self.addCleanup(ch.close)
        stub = tools_pb2_grpc.ToolInterceptorStub(ch)
        ex = call("bash", {"command": "rm -rf /"}).execution
        self.assertEqual(stub.PreExecute(tools_pb2.PreExecuteRequest(execution=ex)).decision.deny.reason,
                         "destructive command")
        ok = call("bash", {"command": "ls"}).execution
        self.assertTrue(stub.PreExecute(tools_pb2.PreExecuteRequest(execution=ok)).decision.HasField("allow"))
        res = tools_pb2.ToolExecutionResult()
        res.content.add().text.text = "the secret is 42"
        d = stub.PostExecute(tools_pb2.PostExecuteRequest(execution=ok, result=res)).decision
        self.assertEqual(d.block.feedback[0].text.text, "redacted: the output contained a secret")
        res.content[0].text.text = "fine"
        self.assertFalse(stub.PostExecute(tools_pb2.PostExecuteRequest(execution=ok, result=res)).HasField("decision"))


class WorkspaceContextTest(unittest.TestCase):
    def serve(self, host):
        srv = Server(host).start()
        self.addCleanup(srv.stop, 0.5)
        ch = grpc.insecure_channel(srv.address)
        self.addCleanup(ch.close)
        return tools_pb2_grpc.ToolHostStub(ch)

    def test_empty_without_a_workspace(self):
        stub = self.serve(ToolHost())
        self.assertEqual(stub.GetWorkspaceContext(tools_pb2.GetWorkspaceContextRequest(cwd="/w")),
                         tools_pb2.GetWorkspaceContextResponse())
        with self.assertRaises(grpc.RpcError) as e:
            stub.GetWorkspaceContext(tools_pb2.GetWorkspaceContextRequest(cwd="rel"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_hook_answers_with_a_clean_cwd(self):
        seen = []

        def ctx(cwd):
            seen.append(cwd)
            return tools_pb2.GetWorkspaceContextResponse(owns_workspace=True, project_root=cwd)
        stub = self.serve(ToolHost(workspace_context=ctx))
        r = stub.GetWorkspaceContext(tools_pb2.GetWorkspaceContextRequest(cwd="/w/./a/"))
        self.assertEqual((r.owns_workspace, r.project_root, seen), (True, "/w/a", ["/w/a"]))
        # A cwd-only hook still answers when the request names a session root.
        r = stub.GetWorkspaceContext(tools_pb2.GetWorkspaceContextRequest(cwd="/w/a", workspace_root="/w/a"))
        self.assertEqual(r.project_root, "/w/a")

    def test_hook_gets_the_session_root(self):
        seen = []

        def ctx(cwd, workspace_root):
            seen.append((cwd, workspace_root))
            return tools_pb2.GetWorkspaceContextResponse(owns_workspace=True, project_root=workspace_root or cwd)
        stub = self.serve(ToolHost(workspace_context=ctx))
        r = stub.GetWorkspaceContext(tools_pb2.GetWorkspaceContextRequest(cwd="/w/a/sub", workspace_root="//w/./a/"))
        self.assertEqual(r.project_root, "/w/a")
        stub.GetWorkspaceContext(tools_pb2.GetWorkspaceContextRequest(cwd="/w/a"))
        self.assertEqual(seen, [("/w/a/sub", "/w/a"), ("/w/a", "")])
        # Keyword-only is named the same way; a hook whose second parameter
        # is something else (with a default) keeps getting the cwd only.
        kw, other = [], []

        def kw_ctx(cwd, *, workspace_root):
            kw.append(workspace_root)
            return tools_pb2.GetWorkspaceContextResponse(owns_workspace=True)

        def other_ctx(cwd, verbose=False):
            other.append(verbose)
            return tools_pb2.GetWorkspaceContextResponse(owns_workspace=True)
        for hook in (kw_ctx, other_ctx):
            self.serve(ToolHost(workspace_context=hook)).GetWorkspaceContext(
                tools_pb2.GetWorkspaceContextRequest(cwd="/w/a", workspace_root="/w/a"))
        self.assertEqual((kw, other), (["/w/a"], [False]))
        with self.assertRaises(grpc.RpcError) as e:
            stub.GetWorkspaceContext(tools_pb2.GetWorkspaceContextRequest(cwd="/w/a", workspace_root="rel"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)


class ServeProcessTest(unittest.TestCase):
    def test_sigterm_graceful(self):
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "examples", "csvhost.py")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = p.stdout.readline()
            self.assertTrue(line.startswith("dsh-toolhost listening on 127.0.0.1:"), line)
            addr = line.split()[-1]
            with grpc.insecure_channel(addr) as ch:
                resp = tools_pb2_grpc.ToolHostStub(ch).ListTools(tools_pb2.ListToolsRequest(), timeout=10)
                self.assertEqual(sorted(t.schema.name for t in resp.tools), ["csv_head", "csv_summary"])
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(15), 0)
        finally:
            if p.poll() is None:
                p.kill()
            p.stdout.close()
            p.stderr.close()


if __name__ == "__main__":
    unittest.main()
