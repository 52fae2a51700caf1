"""FallbackChatModel under the shared model limits: every call counts against the key of the model that makes it."""

from __future__ import annotations

from datetime import timedelta

from agent_runner import Agent, AgentEventType, AgentExecutionPolicy, AgentRunner, RecoverableError, RetryPolicy
from agent_runner.messages import AiMessage
from agent_runner.model_limits import InProcessModelLimiter, LimitReason, LimitWait, ModelLimit, ModelLimiter
from agent_runner.models import FallbackChatModel, ScriptedChatModel
from agent_runner.snapshot import AgentTurnStatus
from tests.unit.agent_runner.turn_kit import EventLog, FakeClock

S = AgentTurnStatus
PRIMARY, SECONDARY = "anthropic:claude", "openai:o4-mini"


def _runner(limiter: ModelLimiter, clock: FakeClock) -> tuple[AgentRunner, EventLog]:
    runner = AgentRunner(policy=AgentExecutionPolicy(retry=RetryPolicy(jitter=0)), clock=clock, model_limiter=limiter)
    events = EventLog()
    runner.add_event_listener(events)
    return runner, events


def _pair(fall_over_after_s: float | None = 2.0) -> tuple[ScriptedChatModel, ScriptedChatModel, Agent]:
    primary = ScriptedChatModel(lambda request: AiMessage("from claude"), rate_limit_key=PRIMARY)
    secondary = ScriptedChatModel(lambda request: AiMessage("from o4"), rate_limit_key=SECONDARY)
    return (
        primary,
        secondary,
        Agent(id="pair", chat_model=FallbackChatModel([primary, secondary], fall_over_after_s=fall_over_after_s)),
    )


def _limiter(clock: FakeClock, primary: ModelLimit, secondary: ModelLimit) -> InProcessModelLimiter:
    return InProcessModelLimiter({PRIMARY: primary, SECONDARY: secondary}, clock=lambda: clock.now.timestamp())


def test_each_call_counts_against_its_own_models_key_and_a_long_wait_falls_over_at_once() -> None:
    # Given one request a minute on each model's key
    clock = FakeClock()
    limiter = _limiter(clock, ModelLimit(rpm=1), ModelLimit(rpm=1))
    runner, events = _runner(limiter, clock)
    primary, secondary, agent = _pair()
    # When three turns start at the same moment
    first, second, third = (runner.run(agent, text) for text in ("one", "two", "three"))
    # Then the first takes the primary's minute, the second falls over to the secondary's at once
    assert (first.final_output, second.final_output) == ("from claude", "from o4")
    assert (primary.calls, secondary.calls) == (1, 1)
    assert [event.data["model"] for event in events.of_type(AgentEventType.MODEL_RESPONSE)] == [PRIMARY, SECONDARY]
    # And the third finds both keys spent: it waits (no attempt, no step) for the soonest of them
    assert third.status is S.RETRY_SCHEDULED and third.attempt == 0 and third.steps == 0
    scheduled = events.of_type(AgentEventType.RETRY_SCHEDULED)[-1]
    # (the second turn's skip left the primary's next minute booked, so the secondary's comes first)
    assert scheduled.data["limit_key"] == SECONDARY
    assert third.next_retry_at is not None and third.next_retry_at >= clock.now + timedelta(seconds=59)
    # When that minute is over, then the secondary answers it on the slot it kept
    clock.now = third.next_retry_at
    assert runner.run_until_blocked(third).final_output == "from o4"
    assert (primary.calls, secondary.calls) == (1, 2)


def test_a_short_wait_for_the_primary_is_waited_for_rather_than_fallen_over() -> None:
    # Given one request a second on the primary, under the default bound of two seconds
    clock = FakeClock()
    runner, events = _runner(_limiter(clock, ModelLimit(rpm=60), ModelLimit(rpm=60)), clock)
    primary, secondary, agent = _pair()
    runner.run(agent, "one")
    # When a second turn starts at once, then it waits a second for the primary's next slot
    waiting = runner.run(agent, "two")
    assert waiting.status is S.RETRY_SCHEDULED and secondary.calls == 0
    assert events.of_type(AgentEventType.RETRY_SCHEDULED)[-1].data["limit_key"] == PRIMARY
    clock.now = waiting.next_retry_at or clock.now
    assert runner.run_until_blocked(waiting).final_output == "from claude"


def test_with_no_bound_the_primary_is_always_waited_for() -> None:
    clock = FakeClock()
    runner, _ = _runner(_limiter(clock, ModelLimit(rpm=1), ModelLimit(rpm=1)), clock)
    primary, secondary, agent = _pair(fall_over_after_s=None)
    runner.run(agent, "one")
    assert runner.run(agent, "two").status is S.RETRY_SCHEDULED
    assert (primary.calls, secondary.calls) == (1, 0)


def test_a_429_that_falls_over_pauses_the_primarys_key_for_every_process() -> None:
    # Given a primary that answers 429 with Retry-After 30 s, once
    clock = FakeClock()
    limiter = _limiter(clock, ModelLimit(concurrency=4), ModelLimit(concurrency=4))
    runner, _ = _runner(limiter, clock)
    refusal = RecoverableError("HTTP 429: slow down", retry_after=30.0, rate_limited=True)
    primary = ScriptedChatModel([refusal, AiMessage("from claude")], rate_limit_key=PRIMARY)
    secondary = ScriptedChatModel(lambda request: AiMessage("from o4"), rate_limit_key=SECONDARY)
    agent = Agent(id="pair", chat_model=FallbackChatModel([primary, secondary]))
    # When a turn runs, then the secondary answers it
    assert runner.run(agent, "one").final_output == "from o4"
    # And the primary's key is paused for anyone else for the 30 s, the secondary's is free
    paused = limiter.acquire(PRIMARY, 1, "someone-else")
    assert isinstance(paused, LimitWait) and paused.reason is LimitReason.PAUSED
    assert paused.until == clock.now + timedelta(seconds=30)
    assert not isinstance(limiter.acquire(SECONDARY, 1, "someone-else"), LimitWait)
    # And the next turn meanwhile goes to the secondary without asking the primary
    assert runner.run(agent, "two").final_output == "from o4"
    assert (primary.calls, secondary.calls) == (1, 2)


def test_a_429_on_the_last_model_waits_for_its_key_without_an_attempt() -> None:
    clock = FakeClock()
    runner, events = _runner(_limiter(clock, ModelLimit(concurrency=4), ModelLimit(concurrency=4)), clock)
    primary = ScriptedChatModel([RecoverableError("overloaded"), AiMessage("from claude")], rate_limit_key=PRIMARY)
    refusal = RecoverableError("HTTP 429", retry_after=5.0, rate_limited=True)
    secondary = ScriptedChatModel([refusal], rate_limit_key=SECONDARY)
    turn = runner.run(Agent(id="pair", chat_model=FallbackChatModel([primary, secondary])), "hi")
    # Both were called (one step), and the turn waits for the secondary's pause, its attempts untouched
    assert turn.status is S.RETRY_SCHEDULED and turn.attempt == 0 and turn.steps == 1
    scheduled = events.of_type(AgentEventType.RETRY_SCHEDULED)[-1]
    assert (scheduled.data["limit_key"], scheduled.data["limit_reason"]) == (SECONDARY, "provider")
    # (plus up to a fifth more, so that waiting turns do not all come back at once)
    assert turn.next_retry_at is not None
    assert clock.now + timedelta(seconds=5) <= turn.next_retry_at <= clock.now + timedelta(seconds=6)
    clock.now = turn.next_retry_at
    assert runner.run_until_blocked(turn).final_output == "from claude"


def test_the_slots_of_both_models_are_freed_whatever_the_calls_did() -> None:
    # Given one concurrent call on each key, and a primary that fails over once
    clock = FakeClock()
    limiter = _limiter(clock, ModelLimit(concurrency=1), ModelLimit(concurrency=1))
    runner, _ = _runner(limiter, clock)
    primary = ScriptedChatModel([RecoverableError("overloaded"), AiMessage("again")], rate_limit_key=PRIMARY)
    secondary = ScriptedChatModel(lambda request: AiMessage("from o4"), rate_limit_key=SECONDARY)
    agent = Agent(id="pair", chat_model=FallbackChatModel([primary, secondary]))
    assert runner.run(agent, "one").final_output == "from o4"
    # Then no slot is left held: the next turn's primary call goes at once
    assert runner.run(agent, "two").final_output == "again"
