"""The MCP server of the example agent (`python -m workers.mcp_example`), spoken to over stdio.

Two tools: `lookup_order` (read-only) and `refund`, which acts for good and first asks the
user to confirm the amount (an input-required result with a form, then the same call again
with the answer and the server's request state).
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
    ToolAnnotations,
)

ORDERS = {"1001": {"item": "headphones", "paid": 59.0}}
CONFIRM_FORM = {
    "type": "object",
    "properties": {"amount": {"type": "number", "title": "Amount to refund"}},
    "required": ["amount"],
}

# Each call starts this server anew over stdio, so its request state is sealed with a key
# that outlives the process (a deployed server shares one between its replicas the same way).
STATE_KEY = os.environ.get("SHOP_STATE_KEY", "example-only-state-key-0123456789-change-me").encode()
server = MCPServer("shop", request_state_security=RequestStateSecurity(keys=[STATE_KEY]))


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_order(order_id: str) -> str:
    """Look an order up by its number."""
    order = ORDERS.get(order_id)
    return json.dumps(order) if order else f"no order {order_id}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def refund(order_id: str, ctx: Context) -> CallToolResult | InputRequiredResult:
    """Refund an order; the user confirms the amount first."""
    answer = (ctx.input_responses or {}).get("confirm")
    if not isinstance(answer, ElicitResult):
        paid = ORDERS.get(order_id, {}).get("paid", 0)
        ask = ElicitRequestFormParams(
            message=f"Refund up to {paid} for order {order_id}?", requested_schema=CONFIRM_FORM
        )
        return InputRequiredResult(input_requests={"confirm": ElicitRequest(params=ask)}, request_state=order_id)
    if answer.action != "accept" or answer.content is None:
        return CallToolResult(content=[TextContent(text="refund not confirmed")], is_error=True)
    return CallToolResult(content=[TextContent(text=f"refunded {answer.content['amount']} for order {order_id}")])


if __name__ == "__main__":
    server.run("stdio")
