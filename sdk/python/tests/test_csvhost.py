import importlib.util
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dsh_toolhost import run_call  # noqa: E402
from dsh_toolhost.gen.dsh.tools.v1 import tools_pb2  # noqa: E402
from dsh_toolhost.tool import ToolContext  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "csvhost", os.path.join(os.path.dirname(__file__), "..", "examples", "csvhost.py"))
csvhost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(csvhost)


class CsvTools(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        with open(os.path.join(self.dir, "people.csv"), "w") as f:
            f.write("name,age,city\nann,31,Oslo\nbob,45,Oslo\ncy,,Rome\n")

    def call(self, t, args):
        ex = tools_pb2.ToolExecution(call_id="c", name=t.name, arguments=json.dumps(args))
        ctx = ToolContext(cwd=self.dir, workspace_root=self.dir)
        return run_call(t, ex, ctx, lambda o: None)

    def text(self, r):
        return "".join(b.text.text for b in r.content)

    def test_summary(self):
        r = self.call(csvhost.csv_summary, {"path": "people.csv"})
        self.assertFalse(r.is_error, self.text(r))
        self.assertEqual(self.text(r), "\n".join([
            "people.csv: 3 rows, 3 columns",
            "- name: text, 3 distinct, empty 0; top: ann (1), bob (1), cy (1)",
            "- age: number, min 31, max 45, mean 38, empty 1",
            "- city: text, 2 distinct, empty 0; top: Oslo (2), Rome (1)",
        ]))
        self.assertEqual(json.loads(r.meta)["rows"], 3)
        self.assertEqual(r.view.generic.title, "people.csv: 3 rows, 3 columns")

    def test_head(self):
        r = self.call(csvhost.csv_head, {"path": "people.csv", "rows": 1})
        self.assertEqual(self.text(r), "| name | age | city |\n|---|---|---|\n| ann | 31 | Oslo |")

    def test_errors(self):
        cases = [
            ({"path": "../etc/passwd"}, "Error: ../etc/passwd is outside the workspace", "FS_PERMISSION_DENIED"),
            ({"path": "missing.csv"}, "Error: missing.csv: no such file", "FS_NOT_FOUND"),
            ({}, 'Error: invalid arguments: missing required property "path"', "INVALID_ARGS"),
        ]
        for args, want, code in cases:
            with self.subTest(args=args):
                r = self.call(csvhost.csv_summary, args)
                self.assertTrue(r.is_error)
                self.assertEqual(self.text(r), want)
                self.assertEqual(r.error.code, code)


if __name__ == "__main__":
    unittest.main()
