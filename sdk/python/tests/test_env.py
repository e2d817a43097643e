"""serve() reads DSH_INSECURE as strictly as the Go servers read a boolean
variable (internal/cmdline Env.Bool): 1/t/true/yes/on, 0/f/false/no/off (any
case; surrounding space is not trimmed, as in Go), unset or empty gives the default, and
anything else is refused, naming the variable, the value and the accepted
forms, before anything listens."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import dsh_toolhost  # noqa: E402
from dsh_toolhost import host as hostmod  # noqa: E402

TRUE_FORMS = ["1", "t", "T", "true", "TRUE", "True", "yes", "YeS", "on", "On"]
FALSE_FORMS = ["0", "f", "F", "false", "FALSE", "False", "no", "NO", "off", "oFF"]
EMPTY_FORMS = [None, ""]  # None: unset
MALFORMED = ["ture", "2", "enabled", "maybe", "-1", "yes please", "truee", "y", "n", "nope", "\u00e9", " on ", "\tTRUE\n", "  1", " off ", "0  ", "   "]
ACCEPTED = "not a boolean (true or false; also 1 or 0, yes or no, on or off)"


def _environ(value):
    """os.environ with DSH_INSECURE set to value (None: unset), restored afterwards."""
    patch = mock.patch.dict(os.environ)
    patch.start()
    os.environ.pop("DSH_INSECURE", None)
    if value is not None:
        os.environ["DSH_INSECURE"] = value
    return patch


class _Built(Exception):
    """Raised by the fake Server: serve() got as far as building its server."""


class EnvBoolTest(unittest.TestCase):
    def test_forms(self):
        cases = [(v, d, True) for v in TRUE_FORMS for d in (False, True)]
        cases += [(v, d, False) for v in FALSE_FORMS for d in (False, True)]
        cases += [(v, d, d) for v in EMPTY_FORMS for d in (False, True)]
        for value, default, want in cases:
            with self.subTest(value=value, default=default):
                patch = _environ(value)
                try:
                    self.assertIs(hostmod._env_bool("DSH_INSECURE", default), want)
                finally:
                    patch.stop()

    def test_malformed_is_refused_naming_variable_value_forms_and_default(self):
        for value in MALFORMED:
            for default in (False, True):
                with self.subTest(value=value, default=default):
                    patch = _environ(value)
                    try:
                        with self.assertRaises(ValueError) as cm:
                            hostmod._env_bool("DSH_INSECURE", default)
                    finally:
                        patch.stop()
                    e = cm.exception
                    self.assertIsInstance(e, dsh_toolhost.EnvError)
                    self.assertEqual((e.variable, e.value), ("DSH_INSECURE", value))
                    self.assertEqual(str(e), 'DSH_INSECURE=%s: %s; unset means %s'  # the value JSON-quoted (Go's %q for these values)
                                     % (json.dumps(value, ensure_ascii=False), ACCEPTED, "true" if default else "false"))


class ServeEnvTest(unittest.TestCase):
    """serve() with a fake Server that records what it was given and stops
    serve() there (serve() otherwise serves until a signal)."""

    def setUp(self):
        # serve() configures logging when the program did not; keep that out of the test process.
        handler = logging.NullHandler()
        logging.getLogger().addHandler(handler)
        self.addCleanup(logging.getLogger().removeHandler, handler)
        self.built = []

        def fake_server(host, **kw):
            self.built.append(kw)
            raise _Built()

        patch = mock.patch.object(hostmod, "Server", fake_server)
        patch.start()
        self.addCleanup(patch.stop)

    def serve(self, value, **kw):
        """The insecure serve() passed to its Server with DSH_INSECURE=value."""
        patch = _environ(value)
        try:
            with self.assertRaises(_Built):
                hostmod.serve([], **kw)
        finally:
            patch.stop()
        return self.built.pop()["insecure"]

    def test_true_false_and_empty(self):
        cases = [(v, True) for v in TRUE_FORMS] + [(v, False) for v in FALSE_FORMS] + [(v, False) for v in EMPTY_FORMS]
        for value, want in cases:
            with self.subTest(value=value):
                self.assertIs(self.serve(value), want)

    def test_the_argument_wins_over_a_well_formed_variable(self):
        self.assertIs(self.serve("1", insecure=False), False)
        self.assertIs(self.serve("off", insecure=True), True)

    def test_malformed_is_refused_before_a_server_is_built(self):
        for value in MALFORMED:
            # Given insecure too: the operator set the variable wrong, as the Go servers refuse it under its flag.
            for kw in ({}, {"insecure": True}, {"insecure": False}):
                with self.subTest(value=value, **kw):
                    patch = _environ(value)
                    try:
                        with self.assertRaises(dsh_toolhost.EnvError) as cm:
                            hostmod.serve([], **kw)
                    finally:
                        patch.stop()
                    msg = str(cm.exception)
                    self.assertIn("DSH_INSECURE=", msg)
                    self.assertIn(json.dumps(value, ensure_ascii=False), msg)
                    self.assertIn(ACCEPTED, msg)
                    self.assertEqual(self.built, [], "serve() built a server")


class ServeProcessTest(unittest.TestCase):
    """A real toolhost process: a malformed DSH_INSECURE exits with the error
    and never listens; a well-formed one in any case is taken."""

    CODE = ("import sys; sys.path.insert(0, %r)\n"
            "from dsh_toolhost import serve\n"
            "serve([])\n" % os.path.join(os.path.dirname(__file__), ".."))

    def start(self, insecure, listen):
        env = dict(os.environ, DSH_INSECURE=insecure, DSH_LISTEN=listen)
        for k in ("DSH_TLS_CERT", "DSH_TLS_KEY", "DSH_TLS_CLIENT_CA", "DSH_ALLOW_PEER"):
            env.pop(k, None)
        return subprocess.Popen([sys.executable, "-c", self.CODE], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def test_malformed_exits_naming_it_and_nothing_listens(self):
        # A port free now; the refused host must not take it. Loopback: the old
        # reading (malformed = false) would have listened there.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = self.start("ture", "127.0.0.1:%d" % port)
        try:
            out, err = p.communicate(timeout=30)
        finally:
            p.kill()
            p.wait()
        self.assertNotEqual(p.returncode, 0)
        self.assertNotIn("listening", out)
        self.assertIn('EnvError: DSH_INSECURE="ture": ' + ACCEPTED + "; unset means false", err)

    def test_well_formed_in_any_case_is_taken(self):
        # Non-loopback without TLS starts only when DSH_INSECURE is read as true.
        p = self.start("On", "0.0.0.0:0")
        try:
            line = p.stdout.readline()
            if not line.startswith("dsh-toolhost listening on 0.0.0.0:"):
                self.fail("not listening: %r; stderr: %s" % (line, p.communicate(timeout=30)[1]))
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("WARN dsh-toolhost: insecure", err)


if __name__ == "__main__":
    unittest.main()
