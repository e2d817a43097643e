"""TLS, mTLS and peer authorization of Server/serve(), attacked like an
intruder would: no certificate, a certificate of another CA, a certificate of
the right CA with the wrong identity, plaintext, a non-loopback plaintext
listen."""

import os
import shutil
import subprocess
import sys
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from dsh_toolhost import Server, TLSConfigError, ToolHost, tool  # noqa: E402
from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2, tools_pb2_grpc  # noqa: E402
from dsh_toolhost.gen.grpc.health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from pki import CA  # noqa: E402

AGENT = "spiffe://dsh/agent"


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


class MTLSTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ca = CA("dsh")
        cls.other = CA("other")
        cls.srv_cert = cls.ca.server("toolhost", uris=("spiffe://dsh/toolhost",))
        cls.agent = cls.ca.client("agent", uris=(AGENT,))
        cls.gateway_named = cls.ca.client("by-dns", dns=("agent.dsh.svc",))
        cls.intruder = cls.ca.client("intruder", uris=("spiffe://dsh/intruder",))
        cls.foreign = cls.other.client("foreign", uris=(AGENT,))

    @classmethod
    def tearDownClass(cls):
        cls.ca.cleanup()
        cls.other.cleanup()

    def setUp(self):
        # Server files live in their own directory so a test can rotate them.
        self.dir = os.path.join(self.ca.dir, self.id().rsplit(".", 1)[-1])
        os.makedirs(self.dir, exist_ok=True)
        self.cert, self.key = os.path.join(self.dir, "tls.crt"), os.path.join(self.dir, "tls.key")
        shutil.copy(self.srv_cert.cert_file, self.cert)
        shutil.copy(self.srv_cert.key_file, self.key)
        self.srv = Server(ToolHost([ping]), tls_cert=self.cert, tls_key=self.key,
                          tls_client_ca=self.ca.cert_file, allow_peers=[AGENT, "agent.dsh.svc"]).start()
        self.addr = "localhost:%d" % self.srv.port

    def tearDown(self):
        self.srv.stop(0)

    def channel(self, leaf=None, ca=None):
        ca = ca or self.ca
        creds = grpc.ssl_channel_credentials(ca.cert_pem, leaf.key_pem if leaf else None, leaf.cert_pem if leaf else None)
        ch = grpc.secure_channel(self.addr, creds)
        self.addCleanup(ch.close)
        return ch

    def list_tools(self, ch):
        return tools_pb2_grpc.ToolHostStub(ch).ListTools(tools_pb2.ListToolsRequest(), timeout=10)

    def assertCode(self, code, fn):
        with self.assertRaises(grpc.RpcError) as cm:
            fn()
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        return cm.exception

    def test_agent_certificate_is_served(self):
        names = [t.schema.name for t in self.list_tools(self.channel(self.agent)).tools]
        self.assertEqual(names, ["ping"])

    def test_dns_san_is_an_identity_too(self):
        self.assertEqual(len(self.list_tools(self.channel(self.gateway_named)).tools), 1)

    def test_wrong_identity_is_permission_denied_on_every_rpc(self):
        ch = self.channel(self.intruder)
        err = self.assertCode(grpc.StatusCode.PERMISSION_DENIED, lambda: self.list_tools(ch))
        self.assertIn("spiffe://dsh/intruder", err.details())
        execute = tools_pb2.ExecuteRequest(execution=tools_pb2.ToolExecution(
            call_id="c", name="ping", arguments="{}", context=tools_pb2.ToolContext(session_id="s", cwd="/tmp")))
        self.assertCode(grpc.StatusCode.PERMISSION_DENIED,
                        lambda: list(tools_pb2_grpc.ToolHostStub(ch).Execute(execute, timeout=10)))
        self.assertCode(grpc.StatusCode.PERMISSION_DENIED,
                        lambda: health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10))

    def test_no_client_certificate_fails_the_handshake(self):
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: self.list_tools(self.channel()))

    def test_certificate_of_another_ca_fails_the_handshake(self):
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: self.list_tools(self.channel(self.foreign)))

    def test_plaintext_client_is_refused(self):
        ch = grpc.insecure_channel(self.addr)
        self.addCleanup(ch.close)
        self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: self.list_tools(ch))

    def test_rotated_certificate_is_picked_up(self):
        old = self.channel(self.agent)
        self.list_tools(old)
        ca2 = CA("rotated")
        self.addCleanup(ca2.cleanup)
        new = ca2.server("toolhost2")
        # Replace the files as cert-manager does (new files renamed over the old).
        for src, dst in ((new.cert_file, self.cert), (new.key_file, self.key)):
            shutil.copy(src, dst + ".tmp")
            os.replace(dst + ".tmp", dst)
        # A new connection sees the new certificate: trusting only the new CA works...
        self.assertEqual(len(self.list_tools(self.channel(self.agent, ca=ca2)).tools), 1)
        # ...and the established connection keeps working.
        self.assertEqual(len(self.list_tools(old).tools), 1)


class ListenRuleTest(unittest.TestCase):
    def test_non_loopback_without_tls_is_refused_naming_insecure(self):
        for addr in ("0.0.0.0:0", "[::]:0"):
            with self.assertRaises(TLSConfigError) as cm:
                Server(ToolHost([ping]), address=addr)
            self.assertIn("insecure", str(cm.exception))

    def test_insecure_starts_with_a_warning(self):
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from dsh_toolhost import Server, ToolHost\n"
                "s = Server(ToolHost(), address='0.0.0.0:0', insecure=True).start(); s.stop(0)\n"
                % os.path.join(os.path.dirname(__file__), ".."))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("WARN", out.stderr)
        self.assertIn("insecure", out.stderr)

    def test_loopback_needs_no_tls(self):
        Server(ToolHost([ping]), address="127.0.0.1:0").start().stop(0)

    def test_bad_combinations(self):
        ca = CA()
        self.addCleanup(ca.cleanup)
        leaf = ca.server("s")
        cases = {
            "cert without key": dict(tls_cert=leaf.cert_file),
            "client ca without cert": dict(tls_client_ca=ca.cert_file),
            "allow peers without client ca": dict(tls_cert=leaf.cert_file, tls_key=leaf.key_file, allow_peers=[AGENT]),
            "missing file": dict(tls_cert="/nonexistent.pem", tls_key=leaf.key_file),
            "not pem": dict(tls_cert=__file__, tls_key=leaf.key_file),
        }
        for name, kw in cases.items():
            with self.subTest(name):
                with self.assertRaises(TLSConfigError):
                    Server(ToolHost([ping]), **kw)


if __name__ == "__main__":
    unittest.main()
