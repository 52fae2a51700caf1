"""Child turns (DESIGN 4.10): creating them for delegation calls, and recording in the parent those that ended.

Children are created with deterministic ids, so a step re-run after a crash finds the
children it created before. The parent waits in WAITING_FOR_CHILD; each child that ends is
recorded in the parent by compare-and-swap, and the save that records the last one makes
the parent runnable, exactly once.
"""

from __future__ import annotations

from agent_runner import event_payloads as payloads
from agent_runner import machine, telemetry_hooks
from agent_runner._cas import retry_on_conflict
from agent_runner._runtime.context import RunnerContext
from agent_runner._runtime.saving import save, suspended_event
from agent_runner.agent import Agent
from agent_runner.errors import VersionConflictError
from agent_runner.messages import ToolCall, UserMessage
from agent_runner.snapshot import AgentTurn, AgentTurnStatus, ChildLink
from agent_runner.suspensions import AgentResumeCommand, ResumeType


def spawn(
    ctx: RunnerContext, parent: AgentTurn, calls: tuple[tuple[ToolCall, Agent, str], ...], expected: int
) -> AgentTurn:
    """Create the children of the delegation `calls` and save the parent waiting for them."""
    store = ctx.turn_store
    now = ctx.clock()
    links: list[ChildLink] = []
    children: list[AgentTurn] = []
    for call, sub_agent, task in calls:
        child_id = machine.child_turn_id(parent.id, call.id)
        child = AgentTurn(
            id=child_id,
            agent_id=sub_agent.id,
            agent_version=sub_agent.version,
            parent_turn_id=parent.id,
            root_turn_id=parent.root_turn_id,
            messages=[UserMessage(id=f"{child_id}-0", content=task)],
            root_conversation_id=parent.root_conversation_id or parent.conversation_id,
            tenant_id=parent.tenant_id,
            # A sub-agent's tools act for the same caller as the parent's.
            metadata=parent.metadata,
            created_at=now,
            updated_at=now,
        )
        child = telemetry_hooks.stamp_new_turn(ctx.telemetry_key, child)  # trace context of the child turn
        try:
            child = save(ctx, child, -1, payloads.turn_started(child, child.messages[0].id))
        except VersionConflictError:
            child = store.load(child_id)  # created by an earlier run of this same step
        links.append(ChildLink(tool_call_id=call.id, agent_id=sub_agent.id, child_turn_id=child_id))
        children.append(child)
    waiting = machine.apply_children_spawned(parent, links, now)
    saved = save(ctx, waiting, expected, suspended_event(ctx, waiting))
    # Children may have ended before the parent's save (another worker ran them): record those now.
    saved = reconcile(ctx, saved)
    for child in children:
        if not child.is_terminal:
            ctx.execution.dispatch(child)
    return saved


def record(ctx: RunnerContext, parent_id: str, child: AgentTurn) -> AgentTurn | None:
    """Apply `child_completed` to the parent; the parent if this made it runnable, else None."""
    command = AgentResumeCommand.child_completed(child.id)

    def attempt() -> AgentTurn | None | object:
        parent = ctx.turn_store.load(parent_id)
        link = next((c for c in parent.children if c.child_turn_id == child.id), None)
        if parent.status is not AgentTurnStatus.WAITING_FOR_CHILD or link is None or link.status is not None:
            # Not waiting yet (its own save will reconcile), or already recorded by someone else.
            return None
        resumed = machine.apply_resume(parent, command, ctx.clock(), child=child)
        event = (
            payloads.turn_resumed(command=ResumeType.CHILD_COMPLETED, child_turn_id=child.id)
            if resumed.status is AgentTurnStatus.RUNNING
            else None
        )
        saved = save(ctx, resumed, parent.version, event)
        return saved if saved.status is AgentTurnStatus.RUNNING else None

    result = retry_on_conflict(parent_id, attempt)
    return result if isinstance(result, AgentTurn) else None


def reconcile(ctx: RunnerContext, parent: AgentTurn) -> AgentTurn:
    """Record every child that ended but is not recorded yet (after a crash or a lost race)."""
    store = ctx.turn_store
    for link in parent.children:
        if link.status is None:
            child = store.load(link.child_turn_id)
            if child.is_terminal:
                record(ctx, parent.id, child)
    return store.load(parent.id)
