"""MCP tools under Celery workers on PostgreSQL: a worker SIGKILLed inside a destructive call, and between a question and its answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_runner import AgentResumeCommand, AgentTurnStatus, SuspensionType, ToolMessage
from tests.helpers.mcp_agents import LOADER, URL_ENV, ask
from tests.helpers.mcp_server import DATES_FORM, MCPServerProcess
from tests.integration.celery_workers.celery_cluster import Cluster

pytestmark = pytest.mark.integration

S = AgentTurnStatus
TIMEOUT_S = 60.0


@pytest.fixture
def mcp_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MCPServerProcess]:
    """The MCP server, its URL in this process's environment too (the producer side builds the agents)."""
    folder = tmp_path / "mcp"
    folder.mkdir()
    server = MCPServerProcess(folder).start()
    monkeypatch.setenv(URL_ENV, server.url)
    try:
        yield server
    finally:
        server.stop()


def test_a_worker_killed_inside_a_destructive_call_never_runs_it_twice(
    make_cluster: Callable[..., Cluster], mcp_server: MCPServerProcess
) -> None:
    cluster = make_cluster(AGENT_RUNNER_AGENT_LOADER=LOADER, **{URL_ENV: mcp_server.url})
    first = cluster.start_worker("first", pool="threads", concurrency=2)
    turn = cluster.runner.start("mcp-agent", ask("delete_record", record_id="r-1", hold=2.0))
    key = f"{turn.id}:call-1"

    # The call reached the server (its start saved first): the worker dies in the middle of it
    cluster.wait_for(lambda: key in mcp_server.started(), TIMEOUT_S, "the call to reach the server")
    assert cluster.load(turn.id).started_call_ids == ["call-1"]
    first.kill()
    cluster.start_worker("second", pool="threads", concurrency=2)
    cluster.start_beat()  # its stale-turn sweep sends the orphaned turn again once the lease expired

    # Another worker takes the turn over: the outcome is unknown, so a person is asked, the call not re-run
    cluster.wait_for(lambda: cluster.load(turn.id).status is S.WAITING_FOR_APPROVAL, TIMEOUT_S, "a person to be asked")
    waiting = cluster.load(turn.id)
    assert waiting.suspension is not None and waiting.suspension.type is SuspensionType.TOOL_OUTCOME_UNKNOWN
    assert mcp_server.started() == [key]
    # The person retries: the same idempotency key goes out again, and the server does not act twice
    cluster.runner.submit_resume(turn.id, AgentResumeCommand.approve_tool("call-1").with_metadata("approverId", "ops"))
    cluster.wait_for(lambda: cluster.load(turn.id).status is S.COMPLETED, TIMEOUT_S, "the turn to complete")

    assert mcp_server.started() == [key, key]
    assert mcp_server.executions() == {key: 1}
    done = cluster.load(turn.id)
    assert [m.content for m in done.messages if isinstance(m, ToolMessage)] == ["deleted r-1"]


def test_a_worker_killed_between_a_question_and_its_answer_loses_nothing(
    make_cluster: Callable[..., Cluster], mcp_server: MCPServerProcess
) -> None:
    cluster = make_cluster(AGENT_RUNNER_AGENT_LOADER=LOADER, **{URL_ENV: mcp_server.url})
    first = cluster.start_worker("first", pool="threads", concurrency=2)
    turn = cluster.runner.start("mcp-agent", ask("book_trip", traveller="cy"))
    cluster.wait_for(lambda: cluster.load(turn.id).status is S.WAITING_FOR_USER, TIMEOUT_S, "the first question")

    first.kill()
    cluster.runner.submit_resume(turn.id, AgentResumeCommand.user_input("call-1", {"city": "Quito"}))
    second = cluster.start_worker("second", pool="threads", concurrency=2)

    def asks_for_dates() -> bool:
        suspension = cluster.load(turn.id).suspension
        return suspension is not None and suspension.form is not None and suspension.form.schema == DATES_FORM

    cluster.wait_for(asks_for_dates, TIMEOUT_S, "the second question")
    second.kill()
    cluster.runner.submit_resume(turn.id, AgentResumeCommand.user_input("call-1", {"nights": 5}))
    cluster.start_worker("third", pool="threads", concurrency=2)
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, TIMEOUT_S, "the turn to end")

    done = cluster.load(turn.id)
    assert done.status is S.COMPLETED, done.error
    assert done.final_output == "done: booked 5 nights in Quito for cy"


def test_a_worker_killed_while_a_task_runs_loses_nothing(
    make_cluster: Callable[..., Cluster], mcp_server: MCPServerProcess
) -> None:
    cluster = make_cluster(AGENT_RUNNER_AGENT_LOADER=LOADER, **{URL_ENV: mcp_server.url})
    first = cluster.start_worker("first", pool="threads", concurrency=2)
    turn = cluster.runner.start("mcp-agent", ask("long_job", name="export", seconds=3.0))

    def waits_on_the_task() -> bool:
        return "operation" in cluster.load(turn.id).tool_state.get("call-1", {})

    cluster.wait_for(waits_on_the_task, TIMEOUT_S, "the task to start")
    task_id = cluster.load(turn.id).tool_state["call-1"]["operation"]["task_id"]
    first.kill()
    cluster.start_worker("second", pool="threads", concurrency=2)
    cluster.start_beat()  # its due-retry sweep sends the turn again when its next poll is due
    cluster.wait_for(lambda: cluster.load(turn.id).is_terminal, TIMEOUT_S, "the turn to end")

    done = cluster.load(turn.id)
    assert done.status is S.COMPLETED, done.error
    assert done.final_output == "done: job export done"
    assert done.attempt == 0 and mcp_server.cancelled_tasks() == []
    assert task_id in (mcp_server.state_dir / "tasks.json").read_text()
