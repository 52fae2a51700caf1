"""A non-idempotent tool whose body raised after it started: the outcome is unknown, never retried blindly.

A timeout or a dropped connection out of the body says nothing about whether the charge
went through. The call is reconciled (or put to a person) exactly as after a crash; it
is retried only when the reconcile function says nothing took effect. `RecoverableError`
is the tool's own statement that nothing happened, and `ToolError` its answer for the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentActionMessage,
    AgentExecutionPolicy,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    InMemoryChatMemoryProvider,
    Middleware,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    Tool,
    ToolCall,
    ToolError,
    ToolMessage,
    ToolOutcome,
)
from tests.unit.agent_runner.turn_kit import FakeClock

S = AgentTurnStatus


class PaymentApiDown(Exception):
    """The payment client's own transient error, named in `retry_on`."""


class OperationalError(Exception):
    """Shaped like a DB-API driver's error for a lost connection (transient by default)."""


class Payments:
    """A payment API without idempotency keys: every charge that goes through is one more charge.

    `fail_with` is raised by the first `failures` calls, after the charge went through
    unless `before_charge`.
    """

    def __init__(self, fail_with: Exception, failures: int = 1, *, before_charge: bool = False) -> None:
        self.charges: list[int] = []
        self.calls = 0
        self.fail_with = fail_with
        self.failures = failures
        self.before_charge = before_charge
        self.reconciled: list[str] = []

    def tool(self, retry_on: tuple[type[BaseException], ...] = ()) -> Tool:
        def charge(amount: int) -> str:
            self.calls += 1
            failing = self.calls <= self.failures
            if failing and self.before_charge:
                raise self.fail_with
            self.charges.append(amount)
            if failing:
                raise self.fail_with
            return f"charged {amount}"

        return Tool(charge, idempotent=False, retry_on=retry_on)

    def reconciled_tool(self, answer: Callable[[], ToolOutcome]) -> Tool:
        tool = self.tool()

        @tool.reconcile
        def look_up(call: ToolCall, idempotency_key: str) -> ToolOutcome:
            self.reconciled.append(idempotency_key)
            return answer()

        return tool


def _runner(tool: Tool, retry_on: tuple[type[BaseException], ...] = ()) -> tuple[AgentRunner, Agent, FakeClock]:
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="pay-1", name="charge", arguments={"amount": 30})]),
            AiMessage(content="paid"),
        ]
    )
    clock = FakeClock()
    retry = RetryPolicy(max_attempts=3, initial_backoff=1.0, jitter=0)
    retry = retry.model_copy(update={"retry_on": (*retry.retry_on, *retry_on)})
    runner = AgentRunner(
        chat_memory_provider=InMemoryChatMemoryProvider(), policy=AgentExecutionPolicy(retry=retry), clock=clock
    )
    return runner, Agent(id="payer", chat_model=model, tools=[tool]), clock


def _run_to_rest(runner: AgentRunner, turn: AgentTurn, clock: FakeClock) -> AgentTurn:
    """Run the turn, letting due retries come, until it waits for a person or ends."""
    turn = runner.run_until_blocked(turn)
    while turn.status is S.RETRY_SCHEDULED:
        clock.advance(3600)
        turn = runner.run_until_blocked(runner.turn_store.load(turn.id))
    return turn


TRANSIENT = [
    pytest.param(TimeoutError("read timed out"), (), (), id="timeout"),
    pytest.param(ConnectionResetError("connection reset by peer"), (), (), id="connection"),
    pytest.param(OperationalError("server closed the connection unexpectedly"), (), (), id="dropped-connection"),
    pytest.param(PaymentApiDown("503"), (PaymentApiDown,), (), id="policy-retry-on"),
    pytest.param(PaymentApiDown("503"), (), (PaymentApiDown,), id="tool-retry-on"),
]


@pytest.mark.parametrize(("error", "policy_retry_on", "tool_retry_on"), TRANSIENT)
def test_a_transient_error_after_the_charge_asks_a_person_instead_of_charging_again(
    error: Exception, policy_retry_on: tuple[type[BaseException], ...], tool_retry_on: tuple[type[BaseException], ...]
) -> None:
    # Given a charge that goes through and then raises an error the retry policy calls transient
    payments = Payments(error)
    runner, agent, clock = _runner(payments.tool(tool_retry_on), policy_retry_on)

    # When the turn runs, with every due retry let in
    turn = _run_to_rest(runner, runner.start(agent, "pay 30", conversation_id="c-1"), clock)

    # Then there was exactly one charge and a person is asked, with the error shown
    assert payments.charges == [30]
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and turn.suspension.is_outcome_unknown
    assert turn.suspension.metadata["error"] == f"{type(error).__name__}: {error}"
    assert f"started and then raised {type(error).__name__}" in turn.suspension.message
    assert turn.started_call_ids == ["pay-1"]
    card = next(m for m in runner.chat_memory_provider("c-1").get_messages(20) if isinstance(m, AgentActionMessage))  # type: ignore[misc]
    assert card.kind == "outcome_unknown" and card.get_actions() == ["RETRY", "MARK_DONE", "FAIL"]


def test_any_other_error_after_the_start_leaves_the_outcome_to_a_person_too() -> None:
    payments = Payments(KeyError("receipt"))
    runner, agent, clock = _runner(payments.tool())
    turn = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)
    assert payments.charges == [30]
    assert turn.status is S.WAITING_FOR_APPROVAL and turn.error is None


@pytest.mark.parametrize(
    ("command", "charges", "content", "is_error"),
    [
        (AgentResumeCommand.approve_tool("pay-1"), [30, 30], "charged 30", False),
        (AgentResumeCommand.tool_result("pay-1", "charge ch_1 went through"), [30], "charge ch_1 went through", False),
        (AgentResumeCommand.reject_tool("pay-1", "refunded by hand"), [30], None, True),
    ],
    ids=["retry", "mark-done", "fail"],
)
def test_the_person_s_choice_does_exactly_what_it_says(
    command: AgentResumeCommand, charges: list[int], content: str | None, is_error: bool
) -> None:
    payments = Payments(TimeoutError("read timed out"))
    runner, agent, clock = _runner(payments.tool())
    waiting = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)

    done = runner.resume(waiting.id, command)

    assert done.status is S.COMPLETED
    assert payments.charges == charges
    [result] = [m for m in done.messages if isinstance(m, ToolMessage)]
    assert result.is_error is is_error
    assert result.content == content if content is not None else "refunded by hand" in result.content
    assert done.started_call_ids == []


def test_a_reconcile_function_that_finds_the_charge_answers_the_call() -> None:
    # Given a charge that went through and timed out, and a reconcile function that finds it
    payments = Payments(TimeoutError("read timed out"))
    runner, agent, clock = _runner(payments.reconciled_tool(lambda: ToolOutcome.done("charge ch_1 found")))

    turn = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)

    # Then it was asked once, with the call's idempotency key, and its answer is the call's result
    assert turn.status is S.COMPLETED
    assert payments.charges == [30]
    assert payments.reconciled == [f"{turn.id}:pay-1"]
    assert [m.content for m in turn.messages if isinstance(m, ToolMessage)] == ["charge ch_1 found"]
    assert turn.started_call_ids == []


def test_not_done_retries_the_call_on_the_retry_schedule() -> None:
    # Given a call that timed out before the charge, and a reconcile function that sees no charge
    payments = Payments(TimeoutError("connect timed out"), before_charge=True)
    runner, agent, clock = _runner(payments.reconciled_tool(ToolOutcome.not_done))

    first = runner.run_until_blocked(runner.start(agent, "pay 30"))

    # Then the call waits for its retry time like any transient failure, and the retry charges once
    assert first.status is S.RETRY_SCHEDULED and first.attempt == 1
    assert first.started_call_ids == [] and payments.charges == []
    done = _run_to_rest(runner, first, clock)
    assert done.status is S.COMPLETED
    assert payments.charges == [30] and len(payments.reconciled) == 1


def test_not_done_after_every_attempt_gives_up_at_max_attempts() -> None:
    payments = Payments(TimeoutError("connect timed out"), failures=10, before_charge=True)
    runner, agent, clock = _runner(payments.reconciled_tool(ToolOutcome.not_done))
    turn = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)
    assert turn.status is S.FAILED and "gave up after 3 attempts" in (turn.error or "")
    assert payments.calls == 3 and len(payments.reconciled) == 3


def test_not_done_after_a_deterministic_error_fails_the_turn() -> None:
    payments = Payments(ValueError("amount in the wrong currency"), before_charge=True)
    runner, agent, clock = _runner(payments.reconciled_tool(ToolOutcome.not_done))
    turn = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)
    assert turn.status is S.FAILED and "ValueError" in (turn.error or "")
    assert payments.calls == 1


def test_unknown_from_the_reconcile_function_asks_a_person_with_its_note() -> None:
    payments = Payments(TimeoutError("read timed out"))
    runner, agent, clock = _runner(payments.reconciled_tool(lambda: ToolOutcome.unknown("the API lags")))
    turn = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and turn.suspension.metadata["note"] == "the API lags"
    assert payments.charges == [30] and len(payments.reconciled) == 1


def test_recoverable_error_says_nothing_happened_and_is_retried_without_asking() -> None:
    payments = Payments(RecoverableError("card network busy, nothing charged"), before_charge=True)
    runner, agent, clock = _runner(payments.reconciled_tool(ToolOutcome.unknown))
    first = runner.run_until_blocked(runner.start(agent, "pay 30"))
    assert first.status is S.RETRY_SCHEDULED
    done = _run_to_rest(runner, first, clock)
    assert done.status is S.COMPLETED and payments.charges == [30]
    assert payments.reconciled == []


def test_tool_error_is_the_call_s_answer_for_the_model() -> None:
    payments = Payments(ToolError("card declined"), before_charge=True)
    runner, agent, clock = _runner(payments.reconciled_tool(ToolOutcome.unknown))
    turn = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)
    assert turn.status is S.COMPLETED
    [result] = [m for m in turn.messages if isinstance(m, ToolMessage)]
    assert result.is_error and result.content == "card declined"
    assert payments.reconciled == []


class RefuseBeforeTheBody(Middleware):
    """Fails once before the body runs (a rate limiter, say): nothing happened."""

    def __init__(self) -> None:
        self.refused = False

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        if not self.refused:
            self.refused = True
            raise TimeoutError("rate limiter timed out")
        return call_next(tool_call)


def test_an_error_before_the_body_ran_is_retried_as_for_any_tool() -> None:
    payments = Payments(TimeoutError("unused"), failures=0)
    runner, agent, clock = _runner(payments.reconciled_tool(ToolOutcome.unknown))
    runner.middleware.append(RefuseBeforeTheBody())
    first = runner.run_until_blocked(runner.start(agent, "pay 30"))
    assert first.status is S.RETRY_SCHEDULED
    assert _run_to_rest(runner, first, clock).status is S.COMPLETED
    assert payments.charges == [30] and payments.reconciled == []


def test_an_idempotent_tool_is_still_retried_on_a_timeout() -> None:
    calls: list[int] = []

    def charge(amount: int) -> str:
        calls.append(amount)
        if len(calls) == 1:
            raise TimeoutError("read timed out")
        return "ok"

    runner, agent, clock = _runner(Tool(charge))
    first = runner.run_until_blocked(runner.start(agent, "pay 30"))
    assert first.status is S.RETRY_SCHEDULED
    assert _run_to_rest(runner, first, clock).status is S.COMPLETED and calls == [30, 30]


class RecastAsRetry(Middleware):
    """Turns whatever the call raised into `RecoverableError`, as a time-limit middleware does."""

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        try:
            return call_next(tool_call)
        except TimeoutError as exc:
            raise RecoverableError("the call ran past its time limit") from exc


class FailAfterTheBody(Middleware):
    """Raises `RecoverableError` once after the body returned (the result never reaches the runner)."""

    def __init__(self) -> None:
        self.failed = False

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        result = call_next(tool_call)
        if not self.failed:
            self.failed = True
            raise RecoverableError("lost on the way back")
        return result


@pytest.mark.parametrize(
    ("middleware", "payments"),
    [
        pytest.param(RecastAsRetry(), Payments(TimeoutError("hung")), id="body-error-recast"),
        pytest.param(FailAfterTheBody(), Payments(TimeoutError("unused"), failures=0), id="after-the-body"),
    ],
)
def test_only_the_body_itself_can_say_nothing_happened(middleware: Middleware, payments: Payments) -> None:
    # Given a middleware that raises RecoverableError in place of the body's error, or after it returned
    runner, agent, clock = _runner(payments.tool())
    runner.middleware.append(middleware)

    turn = _run_to_rest(runner, runner.start(agent, "pay 30"), clock)

    # Then the charge that went through is not repeated: a person is asked
    assert payments.charges == [30]
    assert turn.status is S.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and "RecoverableError" in turn.suspension.message
