"""ReAct tool use: the call protocol, the tool registry, the Python sandbox and answer checking.

    from esopt.envs.tools import make_tool
    python = make_tool("python", timeout=5.0)
    python.run(code="print(6 * 7)")      # "42"
"""

from __future__ import annotations

from esopt.envs.tools.protocol import (
    Answer,
    Malformed,
    Tool,
    ToolCall,
    describe_tools,
    make_tool,
    parse_turn,
    register_tool,
    registered_tools,
    stop_strings,
)
from esopt.sandbox import SandboxResult, check_backend, run_python


def python_tool(timeout: float = 5.0, cpu_seconds: int = 5, memory_mb: int = 512, max_output_bytes: int = 8000,
                sandbox: str = "bwrap") -> Tool:
    """`python(code)`: run code in the sandbox (`sandbox`: a backend of esopt.sandbox, checked here, so a
    machine without bubblewrap fails now, not at the first call); the observation is what it printed (and its
    error)."""
    check_backend(sandbox)

    def run(code: str) -> str:
        result = run_python(code, timeout=timeout, cpu_seconds=cpu_seconds, memory_mb=memory_mb,
                            max_output_bytes=max_output_bytes, backend=sandbox)
        return result.observation(max_output_bytes)

    return Tool("python", "run Python 3 code in a fresh process and see what it prints (print() the result)",
                {"type": "object", "properties": {"code": {"type": "string", "description": "Python source"}},
                 "required": ["code"]}, run, time_limit=timeout)


register_tool("python", python_tool)

__all__ = ["Answer", "Malformed", "SandboxResult", "Tool", "ToolCall", "describe_tools", "make_tool", "parse_turn",
           "python_tool", "register_tool", "registered_tools", "run_python", "stop_strings"]
