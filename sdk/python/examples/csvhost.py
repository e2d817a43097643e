#!/usr/bin/python3
"""An example dsh toolhost in Python with two CSV tools.

    /usr/bin/python3 sdk/python/examples/csvhost.py [--listen 127.0.0.1:7710] [--conformance]

csv_summary summarises a CSV file (rows, and per column the type, the numeric
range and mean, or the most common values); csv_head shows its first rows as
a table. Paths resolve against the session's cwd and must stay inside the
workspace root when the agent sends one. --conformance also serves the tools
of the cross-language conformance suite (tests/conformance).
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dsh_toolhost import (Result, ToolContext, ToolError, ToolHost, generic_call, generic_result,  # noqa: E402
                          location, serve, tool)
from dsh_toolhost.conformance import conformance_tools  # noqa: E402


def _resolve(path: str, ctx: ToolContext) -> str:
    base = ctx.cwd or os.getcwd()
    full = os.path.realpath(os.path.join(base, path))
    root = ctx.workspace_root
    if root:
        root = os.path.realpath(root)
        if full != root and not full.startswith(root + os.sep):
            raise ToolError(f"{path} is outside the workspace", "FS_PERMISSION_DENIED")
    if not os.path.isfile(full):
        raise ToolError(f"{path}: no such file", "FS_NOT_FOUND")
    return full


def _number(s: str):
    try:
        return float(s)
    except ValueError:
        return None


@tool(concurrency="always")
def csv_summary(path: str, delimiter: str = ",", top: int = 3, ctx: ToolContext = None) -> Result:
    """Summarise a CSV file: row count and, per column, its type with min/max/mean for numbers or the most common values.

    Args:
        path: The CSV file, relative to the session's working directory.
        delimiter: The field delimiter.
        top: How many common values to list for a text column.
    """
    full = _resolve(path, ctx)
    with open(full, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return Result(content=f"{path}: empty file", meta={"rows": 0, "columns": []})
        cols = [{"name": h, "numbers": [], "values": collections.Counter(), "empty": 0} for h in header]
        rows = 0
        for row in reader:
            ctx.check_cancelled()
            rows += 1
            if rows % 50000 == 0:
                ctx.emit(f"{rows} rows read\n")
            for i, c in enumerate(cols):
                cell = row[i].strip() if i < len(row) else ""
                if cell == "":
                    c["empty"] += 1
                    continue
                n = _number(cell)
                if n is not None:
                    c["numbers"].append(n)
                c["values"][cell] += 1
    lines = [f"{path}: {rows} rows, {len(cols)} columns"]
    meta_cols = []
    for c in cols:
        filled = rows - c["empty"]
        if filled and len(c["numbers"]) == filled:
            ns = c["numbers"]
            mean = sum(ns) / len(ns)
            lines.append(f"- {c['name']}: number, min {min(ns):g}, max {max(ns):g}, mean {mean:.4g}, empty {c['empty']}")
            meta_cols.append({"name": c["name"], "type": "number", "min": min(ns), "max": max(ns), "mean": mean})
        else:
            common = ", ".join(f"{v} ({k})" for v, k in c["values"].most_common(top))
            lines.append(f"- {c['name']}: text, {len(c['values'])} distinct, empty {c['empty']}; top: {common}")
            meta_cols.append({"name": c["name"], "type": "text", "distinct": len(c["values"])})
    return Result(content="\n".join(lines), meta={"rows": rows, "columns": meta_cols})


@csv_summary.present_call
def _summary_call(args):
    return generic_call(f"Summarise {args['path']}", kind="read", locations=[location(args["path"])])


@csv_summary.present_result
def _summary_result(args, result):
    if result.is_error or not isinstance(result.meta, dict):
        return None
    return generic_result(f"{args['path']}: {result.meta['rows']} rows, {len(result.meta['columns'])} columns")


@tool(concurrency="always")
def csv_head(path: str, rows: int = 5, delimiter: str = ",", ctx: ToolContext = None) -> str:
    """Show the header and the first rows of a CSV file as a Markdown table.

    Args:
        path: The CSV file, relative to the session's working directory.
        rows: How many data rows to show.
        delimiter: The field delimiter.
    """
    if rows < 0:
        raise ToolError("rows must not be negative", "INVALID_ARGS", "ToolArgsError")
    full = _resolve(path, ctx)
    with open(full, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f, delimiter=delimiter)
        table = [r for _, r in zip(range(rows + 1), reader)]
    if not table:
        return f"{path}: empty file"
    width = len(table[0])
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(esc(h) for h in table[0]) + " |", "|" + "---|" * width]
    for r in table[1:]:
        r = (r + [""] * width)[:width]
        out.append("| " + " | ".join(esc(c) for c in r) + " |")
    return "\n".join(out)


@csv_head.present_call
def _head_call(args):
    return generic_call(f"Read {args['path']}", kind="read", locations=[location(args["path"], 1)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default=os.environ.get("DSH_LISTEN", "127.0.0.1:0"), help="HOST:PORT to listen on")
    p.add_argument("--conformance", action="store_true", help="also serve the conformance tools")
    a = p.parse_args()
    host = ToolHost([csv_summary, csv_head])
    if a.conformance:
        for t in conformance_tools(host):
            host.add(t)
    serve(host=host, address=a.listen)


if __name__ == "__main__":
    main()
