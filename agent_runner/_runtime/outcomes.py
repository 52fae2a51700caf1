"""Calls of non-idempotent tools whose outcome is unknown: ask the tool's reconcile function, else a person.

A call of an `@tool(idempotent=False)` tool is saved as started before its body runs. Its
outcome is unknown when the process died before the result was saved, and just as much
when the body raised after it started: a timeout or a dropped connection says nothing
about whether the charge, the email or the order went through. Either way the call is
never run again blindly. Only the exceptions a tool author raises on purpose say what
happened:

- `RecoverableError`: nothing took effect, retry the call on the retry schedule;
- `ToolError`: the call's answer is this message for the model (raise it only when the
  call did not act, or when the message says what it did);
- `AgentFormRequiredException`: raised before any side effect, by contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_runner.errors import DefinitionError, RecoverableError
from agent_runner.machine import Suspend, page_message_id
from agent_runner.messages import ToolCall
from agent_runner.snapshot import AgentTurn, PageAction
from agent_runner.suspensions import AgentSuspension
from agent_runner.tools import Tool, ToolOutcome, tool_scope

NO_RECONCILER_NOTE = "the tool has no reconcile function"


class BodyWatch:
    """Records whether a tool's body ran and what it raised, whatever the middleware around it makes of that.

    The statement that nothing happened must come from the body: a `RecoverableError` a
    middleware raised in place of the body's own error (a time limit recast as a retry),
    or after the body returned, says nothing about what the call did.
    """

    __slots__ = ("entered", "raised")

    def __init__(self) -> None:
        self.entered = False
        self.raised: BaseException | None = None

    def invoke(self, tool: Tool, arguments: Mapping[str, Any]) -> Any:
        """Run the tool on `arguments` (see `Tool.invoke`), noting that it ran and what it raised."""
        self.entered = True
        try:
            return tool.invoke(arguments)
        except BaseException as exc:
            self.raised = exc
            raise

    def leaves_outcome_unknown(self, tool: Tool) -> bool:
        """Whether the call failed in a way that leaves its effect unknown (see the module docstring).

        True for a non-idempotent tool whose body ran and did not itself raise
        `RecoverableError`; `ToolError` and `AgentFormRequiredException` are handled before
        this is asked.
        """
        return self.entered and not tool.idempotent and not isinstance(self.raised, RecoverableError)


def find_outcome(tool: Tool, turn: AgentTurn, call: ToolCall) -> ToolOutcome:
    """Ask the tool's reconcile function what became of `call`; unknown when it has none, fails or answers nonsense."""
    if tool.reconciler is None:
        return ToolOutcome.unknown(NO_RECONCILER_NOTE)
    key = f"{turn.id}:{call.id}"  # the call's idempotency key (AgentToolContext.get_idempotency_key)
    try:
        with tool_scope(turn, call, turn.form_data.get(call.id, {}), lambda _: None):
            found = tool.reconciler(call, key)
        if not isinstance(found, ToolOutcome) or found.state not in ("done", "not_done", "unknown"):
            raise DefinitionError(f"reconcile of tool {tool.name!r} returned {found!r}, not a ToolOutcome")
        return found
    except Exception as exc:
        return ToolOutcome.unknown(f"reconciling raised {type(exc).__name__}: {exc}")


def outcome_unknown_suspension(
    turn: AgentTurn, call: ToolCall, tool: Tool, note: str, raised: Exception | None = None
) -> Suspend:
    """Ask a person to settle a call that started and whose outcome is unknown.

    Args:
        turn: The turn, with the call marked started.
        call: The call.
        tool: Its tool.
        note: What the reconcile function said, or why there was none.
        raised: What the body raised after it started; None when the worker stopped while it ran.
    """
    masked = tool.masked_arguments(call.arguments)
    summary = f"{tool.name}({', '.join(f'{k}={v!r}' for k, v in masked.items())})"
    if raised is None:
        what = f"The call {summary} started but its outcome was not recorded (the worker stopped while it ran)"
    else:
        what = (
            f"The call {summary} started and then raised {type(raised).__name__}: {raised}, so its outcome is unknown"
        )
    message = what + (f": {note}" if note else "") + ". Retry it, mark it done with its result, or fail it."
    metadata: dict[str, Any] = {"tool_name": tool.name, "arguments": masked, "note": note}
    if raised is not None:
        metadata["error"] = f"{type(raised).__name__}: {raised}"
    suspension = AgentSuspension.outcome_unknown(call.id, message, metadata)
    message_id = f"{page_message_id(turn.id, call.id)}-outcome"
    payload: dict[str, Any] = {
        "role": "agent_action",
        "id": message_id,
        "turn_id": turn.id,
        "action_id": call.id,
        "tool_name": tool.name,
        "summary": message,
        "arguments": masked,
        "kind": "outcome_unknown",
    }
    return Suspend(
        suspension, PageAction(message_id=message_id, action_id=call.id, kind="outcome_unknown", payload=payload)
    )
