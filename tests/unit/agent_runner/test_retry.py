"""Recoverable errors: RETRY_SCHEDULED with backoff, resume at the same phase, give up after max_attempts."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from agent_runner import (
    Agent,
    AgentEventType,
    AgentExecutionPolicy,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurnStatus,
    AiMessage,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    Phase,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    SuspensionType,
    ToolCall,
    tool,
)
from tests.unit.agent_runner.turn_kit import START, EventLog, FakeClock, protocol_violations, tool_messages

S = AgentTurnStatus


def _runner(retry: RetryPolicy, clock: FakeClock) -> tuple[AgentRunner, EventLog]:
    runner = AgentRunner(policy=AgentExecutionPolicy(retry=retry), clock=clock)
    events = EventLog()
    runner.add_event_listener(events)
    return runner, events


def test_retry_policy_defaults_match_the_documented_values() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff, policy.multiplier, policy.max_backoff, policy.jitter) == (
        3,
        1.0,
        2.0,
        60.0,
        0.1,
    )


def test_backoff_grows_by_the_multiplier_and_stops_at_max_backoff() -> None:
    policy = RetryPolicy(initial_backoff=2, multiplier=3, max_backoff=10, jitter=0)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [2, 6, 10, 10]


def test_backoff_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(initial_backoff=10, jitter=0.2)
    rng = random.Random(7)
    delays = [policy.backoff(1, rng=rng) for _ in range(200)]
    assert all(8 <= d <= 12 for d in delays)
    assert len(set(delays)) > 1


class _ToolClientDropped(Exception):
    pass


def test_delay_after_sorts_the_error_and_lets_a_longer_retry_after_win() -> None:
    # Given a schedule without jitter: 1 s, then 2 s
    retry = RetryPolicy(initial_backoff=1.0, multiplier=2.0, jitter=0.0)
    # Then a deterministic error gets no wait at all, and a transient one the backoff of its attempt
    assert retry.delay_after(ValueError("bad input"), 1) is None
    assert retry.delay_after(RecoverableError("busy"), 2) == 2.0
    assert retry.delay_after(TimeoutError(), 1) == 1.0
    # And the callee's wait wins only when it is longer than the backoff
    assert retry.delay_after(RecoverableError("busy", retry_after=30.0), 1) == 30.0
    assert retry.delay_after(RecoverableError("busy", retry_after=0.5), 2) == 2.0
    # And a tool's own transient exception types count only when given
    assert retry.delay_after(_ToolClientDropped(), 1) is None
    assert retry.delay_after(_ToolClientDropped(), 1, (_ToolClientDropped,)) == 1.0


def test_a_recoverable_model_error_schedules_a_retry_after_the_initial_backoff() -> None:
    # Given: a model that times out once
    clock = FakeClock()
    runner, events = _runner(RetryPolicy(initial_backoff=2, multiplier=3, jitter=0), clock)
    model = ScriptedChatModel([RecoverableError("timeout"), AiMessage(content="hello")])
    # When: the turn runs
    turn = runner.run(Agent(id="greeter", chat_model=model), "hi")
    # Then: it is saved RETRY_SCHEDULED, due after the initial backoff, at the MODEL phase
    assert turn.status is S.RETRY_SCHEDULED
    assert turn.next_retry_at == START + timedelta(seconds=2)
    assert turn.attempt == 1
    assert turn.phase is Phase.MODEL
    assert turn.suspension is not None and turn.suspension.type is SuspensionType.RETRY
    assert runner.turn_store.load(turn.id) == turn
    [scheduled] = events.of_type(AgentEventType.RETRY_SCHEDULED)
    assert scheduled.data["next_retry_at"] == turn.next_retry_at.isoformat()
    # When: it is retried
    turn = runner.resume(turn.id, AgentResumeCommand.retry())
    # Then: the model was called again and answered; the attempt counter is reset
    assert turn.status is S.COMPLETED and turn.final_output == "hello"
    assert model.calls == 2 and turn.attempt == 0 and turn.next_retry_at is None


def test_the_second_retry_waits_initial_backoff_times_multiplier() -> None:
    clock = FakeClock()
    runner, _ = _runner(RetryPolicy(max_attempts=5, initial_backoff=2, multiplier=3, jitter=0), clock)
    model = ScriptedChatModel([RecoverableError("a"), RecoverableError("b"), AiMessage(content="ok")])
    turn = runner.run(Agent(id="greeter", chat_model=model), "hi")
    clock.advance(1)
    turn = runner.resume(turn.id, AgentResumeCommand.retry())
    assert turn.status is S.RETRY_SCHEDULED and turn.attempt == 2
    assert turn.next_retry_at == START + timedelta(seconds=1 + 6)


def test_retry_after_from_the_callee_wins_over_a_shorter_backoff() -> None:
    clock = FakeClock()
    runner, _ = _runner(RetryPolicy(initial_backoff=1, jitter=0), clock)
    model = ScriptedChatModel([RecoverableError("429", retry_after=30), AiMessage(content="ok")])
    turn = runner.run(Agent(id="greeter", chat_model=model), "hi")
    assert turn.next_retry_at == START + timedelta(seconds=30)


def test_past_max_attempts_the_turn_fails_with_its_history_closed_out() -> None:
    # Given: a model that always times out, three attempts allowed
    clock = FakeClock()
    runner, events = _runner(RetryPolicy(max_attempts=3, initial_backoff=1, jitter=0), clock)
    model = ScriptedChatModel([RecoverableError("timeout")] * 3)
    turn = runner.run(Agent(id="greeter", chat_model=model), "hi")
    # When: it is retried until attempts run out
    turn = runner.resume(turn.id, AgentResumeCommand.retry())
    assert turn.status is S.RETRY_SCHEDULED
    turn = runner.resume(turn.id, AgentResumeCommand.retry())
    # Then: three calls were made in all and the turn FAILED with a closing assistant message
    assert model.calls == 3
    assert turn.status is S.FAILED
    assert turn.error is not None and "timeout" in turn.error
    assert isinstance(turn.messages[-1], AiMessage) and turn.messages[-1].content
    assert events.types(turn.id)[-1] is AgentEventType.TURN_FAILED


def test_a_recoverable_tool_error_retries_the_tool_with_the_same_idempotency_key_and_no_new_model_call() -> None:
    # Given: a tool that fails once, then works
    keys: list[str] = []
    failures = [RecoverableError("busy")]

    @tool
    def reserve(seat: str) -> str:
        """Reserve a seat."""
        keys.append(AgentToolContext.current().get_idempotency_key())
        if failures:
            raise failures.pop()
        return "reserved " + seat

    clock = FakeClock()
    runner, _ = _runner(RetryPolicy(initial_backoff=4, jitter=0), clock)
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="r1", name="reserve", arguments={"seat": "1A"})]),
            AiMessage(content="Done."),
        ]
    )
    # When: the turn runs
    turn = runner.run(Agent(id="booker", chat_model=model, tools=[reserve]), "book")
    # Then: a retry of the TOOLS phase is scheduled, with the call still pending
    assert turn.status is S.RETRY_SCHEDULED and turn.phase is Phase.TOOLS
    assert turn.next_retry_at == START + timedelta(seconds=4)
    assert [c.id for c in turn.pending_tool_calls] == ["r1"]
    assert tool_messages(turn) == []
    # When: it is retried
    turn = runner.resume(turn.id, AgentResumeCommand.retry())
    # Then: the tool ran again with the same key, the model was not asked to redo the call
    assert len(keys) == 2 and keys[0] == keys[1]
    assert [m.content for m in tool_messages(turn)] == ["reserved 1A"]
    assert model.calls == 2 and turn.status is S.COMPLETED


def test_a_retry_before_it_is_due_is_not_run_by_run_until_blocked_but_is_once_due() -> None:
    # Given: a retry due in 2 seconds
    clock = FakeClock()
    runner, _ = _runner(RetryPolicy(initial_backoff=2, jitter=0), clock)
    model = ScriptedChatModel([RecoverableError("timeout"), AiMessage(content="hello")])
    turn = runner.run(Agent(id="greeter", chat_model=model), "hi")
    # When: it is driven before it is due
    early = runner.run_until_blocked(turn)
    # Then: nothing happens
    assert early == turn and model.calls == 1
    # When: the time comes
    clock.advance(2)
    done = runner.run_until_blocked(runner.restore(turn.id))
    # Then: the retry runs
    assert done.status is S.COMPLETED and model.calls == 2


def test_retry_command_is_accepted_before_next_retry_at() -> None:
    clock = FakeClock()
    runner, _ = _runner(RetryPolicy(initial_backoff=3600, jitter=0), clock)
    model = ScriptedChatModel([RecoverableError("timeout"), AiMessage(content="hello")])
    turn = runner.run(Agent(id="greeter", chat_model=model), "hi")
    assert turn.next_retry_at is not None and turn.next_retry_at > clock()
    assert runner.resume(turn.id, AgentResumeCommand.retry()).status is S.COMPLETED


def test_a_deterministic_model_error_fails_the_turn_at_once() -> None:
    clock = FakeClock()
    runner, _ = _runner(RetryPolicy(), clock)
    model = ScriptedChatModel([ValueError("bad request")])
    turn = runner.run(Agent(id="greeter", chat_model=model), "hi")
    assert turn.status is S.FAILED and model.calls == 1
    assert turn.error is not None and "bad request" in turn.error
    assert protocol_violations(turn.messages) == []


def test_a_retry_schedule_does_not_close_out_the_history() -> None:
    clock = FakeClock()
    runner, _ = _runner(RetryPolicy(jitter=0), clock)
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="x1", name="flaky", arguments={})]), AiMessage(content="ok")]
    )

    @tool
    def flaky() -> str:
        """Flaky."""
        raise RecoverableError("later")

    turn = runner.run(Agent(id="f", chat_model=model, tools=[flaky]), "go")
    assert turn.status is S.RETRY_SCHEDULED
    assert tool_messages(turn) == []
    assert isinstance(turn.messages[-1], AiMessage) and turn.messages[-1].tool_calls


def test_the_step_that_schedules_a_retry_reports_the_recoverable_error() -> None:
    runner, _ = _runner(RetryPolicy(jitter=0), FakeClock())
    failure = RecoverableError("timeout")
    model = ScriptedChatModel([failure, AiMessage(content="ok")])
    turn = runner.start(Agent(id="greeter", chat_model=model), "hi")
    result = runner.step(turn)
    assert result.error is failure
    assert result.turn.status is S.RETRY_SCHEDULED and result.response is None


def test_the_step_that_fails_the_turn_reports_the_exception() -> None:
    @tool
    def broken() -> str:
        """Broken."""
        raise KeyError("missing")

    model = ScriptedChatModel([AiMessage(tool_calls=[ToolCall(id="b1", name="broken", arguments={})])])
    runner, _ = _runner(RetryPolicy(), FakeClock())
    turn = runner.step(runner.start(Agent(id="b", chat_model=model, tools=[broken]), "go")).turn
    result = runner.step(turn)
    assert isinstance(result.error, KeyError)
    assert result.turn.status is S.FAILED and result.tool_messages == []


class ProcessCrash(BaseException):
    """Stands for the process dying in the middle of a tool call."""


def test_a_tool_call_re_executed_after_a_crash_gets_the_same_idempotency_key() -> None:
    # Given: a tool whose first run dies with its process, before the result is saved
    keys: list[str] = []

    @tool
    def charge(amount: int) -> str:
        """Charge."""
        keys.append(AgentToolContext.current().get_idempotency_key())
        if len(keys) == 1:
            raise ProcessCrash
        return "charged"

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="charge", arguments={"amount": 5})]), AiMessage(content="done")]
    )
    agent = Agent(id="biller", chat_model=model, tools=[charge])
    store, loader = InMemoryAgentTurnStore(), InMemoryAgentLoader([agent])
    first = AgentRunner(turn_store=store, agent_loader=loader)
    turn = first.start(agent, "bill")
    with pytest.raises(ProcessCrash):
        first.run_until_blocked(turn)
    # When: another process restores the turn and runs it
    second = AgentRunner(turn_store=store, agent_loader=loader)
    finished = second.run_until_blocked(second.restore(turn.id))
    # Then: the call ran again under the same key, and the model was not asked again for it
    assert finished.status is S.COMPLETED
    assert len(keys) == 2 and keys[0] == keys[1]
    assert model.calls == 2
