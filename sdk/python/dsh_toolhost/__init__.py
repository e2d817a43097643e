"""dsh_toolhost: write a dsh toolhost in Python.

Define tools with :func:`tool` (typed, validated) or :func:`raw_tool` (raw JSON
Schema), give them presenters, and :func:`serve` them::

    from dsh_toolhost import tool, serve

    @tool(concurrency="always")
    def greet(name: str) -> str:
        \"\"\"Greet someone.

        Args:
            name: Who to greet.
        \"\"\"
        return f"hello {name}"

    if __name__ == "__main__":
        serve([greet])

Runs on Debian's python3-grpcio and python3-protobuf (use ``/usr/bin/python3``).
"""

from dsh_toolhost.host import EnvError, HealthServicer, Server, TLSConfigError, ToolHost, serve
from dsh_toolhost.interceptor import Interceptor, accept, allow, ask, block, deny
from dsh_toolhost.schema import SchemaError, validate
from dsh_toolhost.tool import (Cancelled, Output, Result, SandboxPolicy, Tool, ToolContext, ToolError, error_result,
                               raw_tool, run_call, tool)
from dsh_toolhost.views import (ToolResult, diff_call, diff_result, file_diff, generic_call, generic_result,
                                image, location, terminal_call, terminal_result, text)

__all__ = [
    "tool", "raw_tool", "Tool", "ToolContext", "SandboxPolicy", "ToolError", "Cancelled", "Output", "Result", "ToolResult",
    "ToolHost", "Server", "serve", "HealthServicer", "TLSConfigError", "EnvError",
    "Interceptor", "allow", "deny", "ask", "accept", "block",
    "validate", "SchemaError", "error_result", "run_call", "text", "image", "location", "file_diff",
    "generic_call", "terminal_call", "diff_call", "generic_result", "terminal_result", "diff_result",
]
