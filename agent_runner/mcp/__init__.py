"""MCP servers as toolsets (optional extra `mcp`, on the official `mcp` SDK).

```python
from agent_runner.mcp import MCPToolset

agent = Agent(id="support", chat_model=model, tools=[MCPToolset("https://tools.example.com/mcp", prefix="crm_")])
```
"""

from __future__ import annotations

try:
    import mcp as _sdk  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("agent_runner.mcp needs the MCP SDK: pip install 'agent-runner[mcp]'") from exc

from agent_runner.mcp._calls import IDEMPOTENCY_META_KEY
from agent_runner.mcp._connection import MCPProtocolError, MCPServerError
from agent_runner.mcp._toolset import MCPTool, MCPToolset

__all__ = ["IDEMPOTENCY_META_KEY", "MCPProtocolError", "MCPServerError", "MCPTool", "MCPToolset"]
