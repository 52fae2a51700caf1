"""MCP tasks (the `io.modelcontextprotocol/tasks` extension): a call answered with a task waits durably, holding no thread."""

from __future__ import annotations

import time
from pathlib import Path

from agent_runner import AgentRunner, AgentTurn, AgentTurnStatus, SuspensionType
from agent_runner.mcp import MCPToolset
from store import SqlAgentTurnStore
from tests.helpers.mcp_server import MCPServerProcess
from tests.integration.mcp.mcp_kit import Model, agent_with, runner_for, tool_results

S = AgentTurnStatus


def poll_until_settled(runner: AgentRunner, turn: AgentTurn, timeout: float = 20.0) -> AgentTurn:
    """Play the timers: step the turn whenever its next poll is due."""
    deadline = time.monotonic() + timeout
    while turn.status is S.RETRY_SCHEDULED:
        assert time.monotonic() < deadline, "the task never ended"
        if turn.next_retry_at is not None:
            time.sleep(max(0.0, (turn.next_retry_at - runner.clock()).total_seconds()))
        turn = runner.run_until_blocked(runner.restore(turn.id))
    return turn


def test_a_task_is_waited_for_across_a_restart_of_both_sides(tmp_path: Path, mcp_server: MCPServerProcess) -> None:
    database = f"sqlite:///{tmp_path / 'turns.db'}"
    with SqlAgentTurnStore(database) as store:
        agent = agent_with(Model(("long_job", {"name": "export", "seconds": 1.0})), MCPToolset(mcp_server.url))
        turn = runner_for(agent, store=store).run(agent, "export everything")

    # The call returned a task: the turn waits on the retry schedule, the task id in its snapshot
    assert turn.status is S.RETRY_SCHEDULED
    assert turn.suspension is not None and turn.suspension.type is SuspensionType.RETRY
    assert turn.suspension.metadata["reason"] == "operation" and turn.attempt == 0
    task_id = turn.tool_state["call-1"]["operation"]["task_id"]
    assert turn.next_retry_at is not None
    assert (turn.next_retry_at - turn.updated_at).total_seconds() == 1.0, "the first poll of the backoff"

    mcp_server.restart()
    with SqlAgentTurnStore(database) as store:
        runner = runner_for(agent_with(Model(), MCPToolset(mcp_server.url)), store=store)
        done = poll_until_settled(runner, runner.restore(turn.id))

    assert done.status is S.COMPLETED, done.error
    assert [m.content for m in tool_results(done)] == ["job export done"]
    assert done.tool_state == {} and task_id not in mcp_server.cancelled_tasks()


def test_a_cancelled_turn_cancels_its_task(mcp_server: MCPServerProcess) -> None:
    agent = agent_with(Model(("long_job", {"name": "report", "seconds": 60.0})), MCPToolset(mcp_server.url))
    runner = runner_for(agent)
    turn = runner.run(agent, "make the report")
    task_id = turn.tool_state["call-1"]["operation"]["task_id"]

    cancelled = runner.cancel(turn.id, "not needed any more")

    assert cancelled.status is S.CANCELLED
    assert mcp_server.cancelled_tasks() == [task_id]
