"""The example agent on a local MCP server over stdio (`python -m workers.mcp_example`) runs end to end."""

from __future__ import annotations

from agent_runner import AgentTurnStatus, ToolMessage
from workers import mcp_example


def test_the_example_agent_refunds_after_the_user_confirms() -> None:
    turn = mcp_example.main()

    assert turn.status is AgentTurnStatus.COMPLETED, turn.error
    lookup, refund = [m for m in turn.messages if isinstance(m, ToolMessage)]
    assert lookup.content == '{"item": "headphones", "paid": 59.0}'
    assert refund.content == turn.final_output == "refunded 59 for order 1001"
