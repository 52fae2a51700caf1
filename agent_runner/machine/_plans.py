"""Plans: what the next step of a runnable turn must do, decided from the snapshot alone."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agent_runner.agent import Agent
from agent_runner.errors import InputLimitError, ToolArgumentsError
from agent_runner.forms import AgentFormDefinition
from agent_runner.limits import InputLimits, check_tool_arguments, preview
from agent_runner.machine._ids import page_message_id
from agent_runner.messages import ToolCall
from agent_runner.policy import AgentExecutionPolicy
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, PageAction
from agent_runner.suspensions import AgentSuspension, Phase, SuspensionType, TimeoutAction
from agent_runner.tools import INVALID_ARGUMENTS_KEY, AgentUserInputTool, Tool

FORM_SOURCE_USER_INPUT_TOOL = "request_user_input"
FORM_SOURCE_TOOL = "tool"
TAKES_DECLINE_KEY = "takes_decline"
"""Suspension metadata of a tool's form whose tool runs again when the person declines it."""


@dataclass(frozen=True)
class Terminate:
    """End the turn abnormally with `status`, closing out its history."""

    status: AgentTurnStatus
    reason: str


@dataclass(frozen=True)
class CallModel:
    """Call the chat model once."""


@dataclass(frozen=True)
class ExecuteTool:
    """Execute `call` with `tool`."""

    call: ToolCall
    tool: Tool


@dataclass(frozen=True)
class ReconcileTool:
    """A non-idempotent call started earlier and its outcome was not recorded: find it out, never re-run blindly."""

    call: ToolCall
    tool: Tool


@dataclass(frozen=True)
class WriteToolResult:
    """Answer `call` without executing anything (unknown tool, invalid arguments, a child's output)."""

    call: ToolCall
    content: str
    is_error: bool


@dataclass(frozen=True)
class Suspend:
    """Stop and wait for a person (until `timeout`, if set; then `on_timeout` applies)."""

    suspension: AgentSuspension
    page_action: PageAction | None
    timeout: timedelta | None = None
    on_timeout: TimeoutAction | None = None


@dataclass(frozen=True)
class SpawnChildren:
    """Create one child turn per delegation call and wait for them."""

    calls: tuple[tuple[ToolCall, Agent, str], ...]
    """(call, sub-agent, task) for each delegation call that has no child yet."""


StepPlan = Terminate | CallModel | ExecuteTool | ReconcileTool | WriteToolResult | Suspend | SpawnChildren


def plan_step(turn: AgentTurn, agent: Agent, policy: AgentExecutionPolicy) -> StepPlan:
    """Decide what the next step of a runnable turn does. Limits are checked first."""
    if turn.cancel_requested:
        return Terminate(AgentTurnStatus.CANCELLED, turn.cancel_reason or policy.cancellation_reason)
    if turn.steps >= policy.max_steps:
        return Terminate(AgentTurnStatus.MAX_STEPS_REACHED, f"the turn reached its limit of {policy.max_steps} steps")
    budget_reason = budget_exceeded(turn, agent)
    if budget_reason:
        return Terminate(AgentTurnStatus.BUDGET_EXCEEDED, budget_reason)
    if turn.phase is Phase.MODEL or not turn.pending_tool_calls:
        if turn.model_iterations >= agent.max_iterations:
            return Terminate(
                AgentTurnStatus.MAX_ITERATIONS_REACHED,
                f"the turn reached its limit of {agent.max_iterations} model calls",
            )
        return CallModel()
    return _plan_tool(turn, agent, turn.pending_tool_calls[0], policy.limits)


def budget_exceeded(turn: AgentTurn, agent: Agent) -> str | None:
    """Return why the turn is over its budget, or None."""
    budget = agent.budget
    # A final answer's reserve is kept out of what the turn's own work may spend.
    reserve = agent.final_answer
    tokens = budget.max_total_tokens
    if tokens is not None and reserve is not None:
        tokens -= reserve.reserved_tokens
    cost = budget.max_cost
    if cost is not None and reserve is not None:
        cost -= reserve.reserved_cost
    kept = " (less the final answer's reserve)" if reserve is not None else ""
    if tokens is not None and turn.usage.total_tokens > tokens:
        return f"the turn used {turn.usage.total_tokens} tokens, over its budget of {tokens}{kept}"
    if cost is not None and turn.usage.cost > cost:
        return f"the turn cost {turn.usage.cost:.6g}, over its budget of {cost:.6g}{kept}"
    return None


def _plan_tool(turn: AgentTurn, agent: Agent, call: ToolCall, limits: InputLimits) -> StepPlan:
    try:
        # Before anything copies the arguments into a suspension or a page message.
        check_tool_arguments(limits, call.arguments)
    except InputLimitError as exc:
        return WriteToolResult(
            call,
            f"The arguments for tool {preview(call.name, 64)!r} were refused, so the tool was not run: found "
            f"{exc.found}, allowed {exc.limit}. Call it again with arguments within this limit.",
            True,
        )
    invalid = call.arguments.get(INVALID_ARGUMENTS_KEY)
    if isinstance(invalid, dict) and len(call.arguments) == 1:
        return WriteToolResult(
            call,
            f"The arguments for tool {call.name!r} could not be used ({invalid.get('error')}), so the tool "
            "was not run. Call it again with a JSON object that matches its parameters.",
            True,
        )
    sub_agent = agent.sub_agent(call.name)
    if sub_agent is not None:
        return _plan_delegation(turn, agent, call)
    tool = agent.tool(call.name) or agent.listed_tool(turn, call.name)
    if tool is None:
        listed = [t.name for t in turn.listed_tools or ()]
        known = sorted([t.name for t in agent.tools] + [a.id for a in agent.sub_agents] + listed)
        return WriteToolResult(
            call, f"Unknown tool {preview(call.name, 64)!r}. Available tools: {', '.join(known) or 'none'}.", True
        )
    if isinstance(tool, AgentUserInputTool):
        return _plan_user_input(turn, tool, call)
    if call.id in turn.started_call_ids:
        return ReconcileTool(call, tool)
    if tool.requires_approval and call.id not in turn.approved_call_ids:
        try:
            tool.validate_arguments(call.arguments)
        except ToolArgumentsError as exc:
            # Nobody should be asked to approve a call that cannot run.
            return WriteToolResult(call, str(exc), True)
        masked = tool.masked_arguments(call.arguments)
        summary = f"{tool.name}({', '.join(f'{k}={preview(repr(v))}' for k, v in masked.items())})"
        suspension = AgentSuspension(
            type=SuspensionType.TOOL_APPROVAL,
            correlation_id=call.id,
            message=f"Approve the call {summary}?",
            resume_phase=Phase.TOOLS,
            metadata={"tool_name": tool.name, "arguments": masked},
        )
        payload: dict[str, Any] = {
            "role": "agent_action",
            "id": page_message_id(turn.id, call.id),
            "turn_id": turn.id,
            "action_id": call.id,
            "tool_name": tool.name,
            "summary": summary,
            "arguments": masked,
        }
        return Suspend(
            suspension,
            PageAction(message_id=payload["id"], action_id=call.id, kind="approval", payload=payload),
            timeout=tool.approval_timeout,
            on_timeout=TimeoutAction(tool.on_timeout) if tool.approval_timeout is not None else None,
        )
    return ExecuteTool(call, tool)


def _plan_user_input(turn: AgentTurn, tool: AgentUserInputTool, call: ToolCall) -> StepPlan:
    key = call.arguments.get("formKey")
    form = tool.form(key) if isinstance(key, str) else None
    if form is None or set(call.arguments) - {"formKey"}:
        known = ", ".join(f.key for f in tool.forms) or "none"
        return WriteToolResult(call, f"Unknown or missing formKey {key!r}. Known form keys: {known}.", True)
    return form_suspension(turn, call, form, FORM_SOURCE_USER_INPUT_TOOL, form.description)


def form_suspension(
    turn: AgentTurn,
    call: ToolCall,
    form: AgentFormDefinition,
    source: str,
    message: str,
    *,
    takes_decline: bool = False,
) -> Suspend:
    """Suspend for a form, freezing its full definition (schema included) into the snapshot.

    With `takes_decline`, a declined form runs the tool again (it tells whoever asked); else
    the decline answers the call.
    """
    metadata: dict[str, Any] = {"form_source": source, "tool_name": call.name, "form_key": form.key}
    if takes_decline:
        metadata[TAKES_DECLINE_KEY] = True
    suspension = AgentSuspension(
        type=SuspensionType.USER_INPUT,
        correlation_id=call.id,
        message=message or f"Please fill in the form {form.key!r}.",
        resume_phase=Phase.TOOLS,
        metadata=metadata,
        form=form,
    )
    payload: dict[str, Any] = {
        "role": "agent_form",
        "id": page_message_id(turn.id, call.id),
        "turn_id": turn.id,
        "action_id": call.id,
        "form_key": form.key,
        "description": form.description,
        "schema": form.schema,
    }
    timeout = form.timeout if isinstance(form.timeout, timedelta) else None
    return Suspend(
        suspension,
        PageAction(message_id=payload["id"], action_id=call.id, kind="form", payload=payload),
        timeout=timeout,
        on_timeout=TimeoutAction(form.on_timeout) if timeout is not None else None,
    )


def _plan_delegation(turn: AgentTurn, agent: Agent, call: ToolCall) -> StepPlan:
    link = turn.child(call.id)
    if link is not None and link.status is not None:
        completed = link.status is AgentTurnStatus.COMPLETED
        content = link.output or ""
        if not completed:
            content = f"The {link.agent_id} agent did not complete ({link.status}): {content}"
        return WriteToolResult(call, content, not completed)
    spawn: list[tuple[ToolCall, Agent, str]] = []
    for pending in turn.pending_tool_calls:
        sub = agent.sub_agent(pending.name)
        if sub is None or turn.child(pending.id) is not None:
            continue
        task = pending.arguments.get("task")
        if not isinstance(task, str) or not task.strip() or set(pending.arguments) - {"task"}:
            if pending.id == call.id:
                return WriteToolResult(call, 'Invalid arguments: expected {"task": "<non-empty string>"}.', True)
            continue
        spawn.append((pending, sub, task))
    return SpawnChildren(tuple(spawn))
