"""Calls against a shared model limit: no capacity means a wait without an attempt, never a failure."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentEventType,
    AgentExecutionPolicy,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    ChatResponse,
    InProcessModelLimiter,
    ModelLimit,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    SuspensionType,
    Usage,
)
from agent_runner.errors import StoreUnavailableError
from agent_runner.model_limits import LimitGrant, LimitWait
from agent_runner.models.openai import OpenAIChatModel
from tests.unit.agent_runner.turn_kit import EventLog, FakeClock

S = AgentTurnStatus
KEY = "scripted:model"


def _runner(
    limits: dict[str, ModelLimit], clock: FakeClock, retry: RetryPolicy | None = None
) -> tuple[AgentRunner, InProcessModelLimiter, EventLog]:
    limiter = InProcessModelLimiter(limits, clock=lambda: clock.now.timestamp())
    runner = AgentRunner(policy=AgentExecutionPolicy(retry=retry or RetryPolicy()), clock=clock, model_limiter=limiter)
    events = EventLog()
    runner.add_event_listener(events)
    return runner, limiter, events


def _agent(model: ScriptedChatModel) -> Agent:
    return Agent(id="limited", instructions="answer", chat_model=model)


def test_a_call_without_capacity_waits_for_its_slot_without_an_attempt_and_then_completes() -> None:
    # Given a limit of one request a second and a model counted against it
    clock = FakeClock()
    runner, _, events = _runner({KEY: ModelLimit(rpm=60)}, clock)
    model = ScriptedChatModel(lambda request: AiMessage("done"), rate_limit_key=KEY)
    agent = _agent(model)
    # When two turns start at the same moment
    first = runner.run(agent, "one")
    second = runner.run(agent, "two")
    # Then the first completes and the second waits for the next slot, its attempts untouched
    assert first.status is S.COMPLETED
    assert second.status is S.RETRY_SCHEDULED and second.attempt == 0 and model.calls == 1
    assert second.suspension is not None and second.suspension.type is SuspensionType.RETRY
    assert second.next_retry_at is not None
    assert clock.now + timedelta(seconds=1) <= second.next_retry_at <= clock.now + timedelta(seconds=1.06)
    scheduled = events.of_type(AgentEventType.RETRY_SCHEDULED)[-1]
    assert scheduled.data["limit_key"] == KEY and scheduled.data["limit_reason"] == "rpm"
    assert scheduled.data["attempt"] == 0 and KEY in scheduled.data["error"]
    # When its time comes, then it takes its slot and completes
    clock.now = second.next_retry_at
    assert runner.run_until_blocked(second).status is S.COMPLETED and model.calls == 2
    resumed = events.of_type(AgentEventType.TURN_RESUMED)[-1]
    assert resumed.data["reason"] == "model limit wait over"


def test_many_waits_never_use_up_the_retry_attempts() -> None:
    clock = FakeClock()
    runner, _, _ = _runner({KEY: ModelLimit(rpm=60)}, clock, RetryPolicy(max_attempts=1))
    agent = _agent(ScriptedChatModel(lambda request: AiMessage("done"), rate_limit_key=KEY))
    turns = [runner.run(agent, f"message {n}") for n in range(6)]
    assert [t.status for t in turns] == [S.COMPLETED] + [S.RETRY_SCHEDULED] * 5
    while any(not t.is_terminal for t in turns):
        clock.advance(1.1)
        turns = [t if t.is_terminal else runner.run_until_blocked(t) for t in turns]
    assert {t.status for t in turns} == {S.COMPLETED}


def test_a_model_whose_key_has_no_limit_is_not_held_back() -> None:
    clock = FakeClock()
    runner, _, _ = _runner({"other:model": ModelLimit(rpm=1)}, clock)
    agent = _agent(ScriptedChatModel(lambda request: AiMessage("done"), rate_limit_key=KEY))
    assert [runner.run(agent, "hi").status for _ in range(3)] == [S.COMPLETED] * 3


def test_a_provider_429_pauses_the_key_for_every_turn_and_waits_without_an_attempt() -> None:
    # Given a limited model that answers 429 with Retry-After 5 s once
    clock = FakeClock()
    runner, limiter, events = _runner({KEY: ModelLimit(concurrency=4)}, clock, RetryPolicy(max_attempts=1))
    refusal = RecoverableError("HTTP 429: slow down", retry_after=5.0, rate_limited=True)
    agent = _agent(ScriptedChatModel([refusal, AiMessage("done")], rate_limit_key=KEY))
    # When the turn runs, then it waits 5 s, no attempt used (one attempt allowed: a retry would fail it)
    turn = runner.run(agent, "hi")
    assert turn.status is S.RETRY_SCHEDULED and turn.attempt == 0
    assert turn.next_retry_at is not None and turn.next_retry_at >= clock.now + timedelta(seconds=5)
    scheduled = events.of_type(AgentEventType.RETRY_SCHEDULED)[-1]
    assert scheduled.data["limit_reason"] == "provider" and "429" in scheduled.data["error"]
    # And the key is paused for any other call until then
    paused = limiter.acquire(KEY, 1, "someone-else")
    assert isinstance(paused, LimitWait) and paused.reason == "paused"
    assert paused.until == clock.now + timedelta(seconds=5)
    # When the pause is over, then the turn completes
    clock.now = turn.next_retry_at
    assert runner.run_until_blocked(turn).status is S.COMPLETED


def test_429s_in_a_row_beyond_the_bound_count_as_attempts_so_a_spent_quota_still_ends_the_turn() -> None:
    clock = FakeClock()
    retry = RetryPolicy(max_attempts=2, max_provider_limit_waits=2, jitter=0)
    runner, _, _ = _runner({KEY: ModelLimit(concurrency=4)}, clock, retry)

    def always_refused(request: Any) -> AiMessage:
        raise RecoverableError("HTTP 429: quota exceeded", retry_after=1.0, rate_limited=True)

    model = ScriptedChatModel(always_refused, rate_limit_key=KEY)
    turn = runner.run(_agent(model), "hi")
    for _ in range(10):
        if turn.is_terminal:
            break
        assert turn.next_retry_at is not None
        clock.now = turn.next_retry_at
        turn = runner.run_until_blocked(turn)
    # Two waits on the pause, then the two attempts of the retry policy
    assert turn.status is S.FAILED and model.calls == 4
    assert turn.error is not None and "gave up after 2 attempts" in turn.error


class _Unreachable(InProcessModelLimiter):
    def acquire(
        self,
        key: str,
        estimated_tokens: int,
        reservation_id: str,
        booking_id: str | None = None,
        tenant: str | None = None,
    ) -> Any:
        raise StoreUnavailableError("Redis at redis://limits/0 was unavailable")


def test_an_unreachable_limiter_makes_the_call_wait_and_never_sends_it() -> None:
    clock = FakeClock()
    limiter = _Unreachable({KEY: ModelLimit(rpm=60)})
    runner = AgentRunner(clock=clock, model_limiter=limiter)
    model = ScriptedChatModel(lambda request: AiMessage("done"), rate_limit_key=KEY)
    turn = runner.run(_agent(model), "hi")
    assert turn.status is S.RETRY_SCHEDULED and turn.attempt == 0 and model.calls == 0
    assert turn.suspension is not None and turn.suspension.metadata["limit_reason"] == "unavailable"


def test_the_reservation_is_settled_with_the_usage_the_model_reports() -> None:
    clock = FakeClock()
    runner, limiter, _ = _runner({KEY: ModelLimit(tpm=6000)}, clock)  # 100 tokens a second
    model = ScriptedChatModel(
        lambda request: ChatResponse(AiMessage("done"), Usage(10, 10)), rate_limit_key=KEY, output_allowance=900
    )
    assert runner.run(_agent(model), "hi").status is S.COMPLETED
    # Over 900 tokens were reserved of the room of 1000, but only 20 used: 980 more fit at once
    assert isinstance(limiter.acquire(KEY, 980, "next"), LimitGrant)


@pytest.mark.parametrize(
    ("given", "settings", "key", "allowance"),
    [
        (None, {}, "openai:gpt-4o-mini", None),
        ("account-b:gpt-4o-mini", {"max_tokens": 256}, "account-b:gpt-4o-mini", 256),
        (None, {"max_completion_tokens": 64}, "openai:gpt-4o-mini", 64),
    ],
)
def test_the_openai_adapter_names_its_limit_key_and_output_allowance(
    given: str | None, settings: dict[str, Any], key: str, allowance: int | None
) -> None:
    model = OpenAIChatModel("gpt-4o-mini", api_key="sk-test", rate_limit_key=given, **settings)
    assert (model.rate_limit_key, model.output_allowance()) == (key, allowance)


def test_wait_times_are_datetimes_in_utc() -> None:
    limiter = InProcessModelLimiter({KEY: ModelLimit(rpm=1)}, clock=lambda: 1_800_000_000.0)
    limiter.acquire(KEY, 1, "a")
    wait = limiter.acquire(KEY, 1, "b")
    assert isinstance(wait, LimitWait) and isinstance(wait.until, datetime) and wait.until.utcoffset() == timedelta(0)
