"""An agent whose tools live on an MCP server, end to end: `python -m workers.mcp_example`.

The server (`workers/mcp_example_server.py`) is started over stdio by the toolset itself;
the model is scripted; this script plays the user who confirms the refund the server asks
about. The turn waits for that answer like for any form: durably, in its snapshot.
"""

from __future__ import annotations

import sys

from mcp import StdioServerParameters

from agent_runner import (
    Agent,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
)
from agent_runner.mcp import MCPToolset

SERVER = StdioServerParameters(command=sys.executable, args=["-m", "workers.mcp_example_server"])


def shop_model(request: ChatRequest) -> AiMessage:
    """Look the order up, refund it, then say what the tool said."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not results:
        return AiMessage(tool_calls=[ToolCall(id="lookup", name="shop_lookup_order", arguments={"order_id": "1001"})])
    if len(results) == 1:
        return AiMessage(tool_calls=[ToolCall(id="refund", name="shop_refund", arguments={"order_id": "1001"})])
    return AiMessage(content=results[-1].content)


def build_agent() -> Agent:
    """The example agent: one MCP toolset, its tools named `shop_*`."""
    shop = MCPToolset(SERVER, name="shop", prefix="shop_")
    return Agent(id="shop-assistant", chat_model=ScriptedChatModel(shop_model), tools=[shop])


def main() -> AgentTurn:
    """Run the turn, answer the server's question as the user would, and return the finished turn."""
    runner = AgentRunner()
    turn = runner.run(build_agent(), "Please refund order 1001.")
    print(f"turn {turn.id}: {turn.status}")
    if turn.status is AgentTurnStatus.WAITING_FOR_USER and turn.suspension is not None:
        print(f"the server asks: {turn.suspension.message}")
        turn = runner.resume(
            turn.id, AgentResumeCommand.user_input(turn.suspension.correlation_id or "", {"amount": 59})
        )
    print(f"turn {turn.id}: {turn.status}: {turn.final_output}")
    return turn


if __name__ == "__main__":
    main()
