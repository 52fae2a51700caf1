"""Transient errors: connection errors, timeouts and a driver's dropped connection are retried on schedule."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import pytest

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    DefinitionError,
    RetryPolicy,
    ScriptedChatModel,
    Tool,
    ToolCall,
    tool,
)

S = AgentTurnStatus


class OperationalError(Exception):
    """Shaped like a DB-API 2.0 driver's error for a lost connection."""


class TicketApiDown(Exception):
    pass


def _agent(tool_fn: Tool, retry: RetryPolicy | None = None) -> Agent:
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="work", arguments={})]), AiMessage(content="done")]
    )
    return Agent(id="a", chat_model=model, tools=[tool_fn], retry=retry)


def _failing(error: BaseException, times: int = 1, retry_on: Sequence[type[BaseException]] = ()) -> Tool:
    calls = {"n": 0}

    def work() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error
        return "ok"

    return Tool(work, retry_on=retry_on)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError("connection reset by peer"),
        TimeoutError("read timed out"),
        OperationalError("server closed the connection unexpectedly"),
        sqlite3.OperationalError("database is locked"),
    ],
)
def test_default_transient_errors_schedule_a_retry(error: BaseException) -> None:
    runner = AgentRunner(policy=AgentExecutionPolicy(retry=RetryPolicy(initial_backoff=0, jitter=0)))
    turn = runner.run(_agent(_failing(error)), "go")
    assert turn.status is S.RETRY_SCHEDULED
    assert type(error).__name__ in (turn.suspension.message if turn.suspension else "")
    assert runner.run_until_blocked(turn).status is S.COMPLETED


def test_other_errors_still_fail_the_turn() -> None:
    turn = AgentRunner().run(_agent(_failing(KeyError("boom"))), "go")
    assert turn.status is S.FAILED and "KeyError" in (turn.error or "")


def test_a_tool_declares_its_own_transient_errors() -> None:
    runner = AgentRunner(policy=AgentExecutionPolicy(retry=RetryPolicy(initial_backoff=0, jitter=0)))
    turn = runner.run(_agent(_failing(TicketApiDown("503"), retry_on=[TicketApiDown])), "go")
    assert turn.status is S.RETRY_SCHEDULED
    assert runner.run_until_blocked(turn).status is S.COMPLETED


def test_an_agent_retry_policy_overrides_the_runner_one() -> None:
    agent = _agent(
        _failing(TicketApiDown("503"), times=5),
        retry=RetryPolicy(max_attempts=2, initial_backoff=0, jitter=0, retry_on=(TicketApiDown,)),
    )
    runner = AgentRunner(policy=AgentExecutionPolicy(retry=RetryPolicy(max_attempts=10, initial_backoff=0)))
    turn = runner.run(agent, "go")
    assert turn.status is S.RETRY_SCHEDULED
    turn = runner.run_until_blocked(turn)
    assert turn.status is S.FAILED and "gave up after 2 attempts" in (turn.error or "")


def test_retry_on_accepts_only_exception_classes() -> None:
    with pytest.raises(DefinitionError, match="retry_on takes exception classes"):

        @tool(retry_on=["ConnectionError"])  # type: ignore[list-item]
        def work() -> str:
            return "ok"
