"""The Celery dispatcher, the inbox notifier and the soft-time-limit middleware, without a broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from agent_runner import (
    Agent,
    AgentEvent,
    AgentEventType,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    RecoverableError,
    ScriptedChatModel,
    StoreUnavailableError,
    Tool,
    ToolCall,
)
from agent_runner.persistence import ConversationKey
from workers.celery_app.dispatch import CeleryDispatcher, InboxNotifier
from workers.celery_app.middleware import SoftTimeLimitAsRetry
from workers.settings import WorkerSettings

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class RecordingApp:
    """Stands in for a Celery app: records what would have been published."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.fail = fail

    def send_task(self, name: str, args: tuple[Any, ...], **options: Any) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((name, args, options))


def dispatcher(app: RecordingApp, **env: str) -> CeleryDispatcher:
    settings = WorkerSettings.from_env({"AGENT_RUNNER_QUEUE": "q", "AGENT_RUNNER_MAX_ETA_S": "300", **env})
    return CeleryDispatcher(app, settings, clock=lambda: NOW)


def turn(status: AgentTurnStatus, version: int = 3, retry_in: float | None = None) -> AgentTurn:
    return AgentTurn(
        id="t-1",
        agent_id="a",
        root_turn_id="t-1",
        status=status,
        version=version,
        next_retry_at=None if retry_in is None else NOW + timedelta(seconds=retry_in),
    )


@pytest.mark.parametrize("status", [AgentTurnStatus.READY, AgentTurnStatus.RUNNING])
def test_a_runnable_turn_is_sent_now_with_its_version(status: AgentTurnStatus) -> None:
    app = RecordingApp()
    dispatcher(app).dispatch(turn(status))
    assert app.sent == [("agent_runner.step_turn", ("t-1", 3), {"queue": "q"})]


def test_a_retry_within_the_eta_limit_is_sent_with_its_eta() -> None:
    app = RecordingApp()
    dispatcher(app).dispatch(turn(AgentTurnStatus.RETRY_SCHEDULED, retry_in=120))
    assert app.sent == [("agent_runner.step_turn", ("t-1", 3), {"queue": "q", "eta": NOW + timedelta(seconds=120)})]


def test_a_retry_beyond_the_eta_limit_is_left_to_the_sweep() -> None:
    app = RecordingApp()
    assert dispatcher(app).send_step("t-1", 3, eta=NOW + timedelta(seconds=301)) is False
    dispatcher(app).dispatch(turn(AgentTurnStatus.RETRY_SCHEDULED, retry_in=3600))
    assert app.sent == []


def test_a_retry_already_due_is_sent_without_an_eta() -> None:
    app = RecordingApp()
    dispatcher(app).dispatch(turn(AgentTurnStatus.RETRY_SCHEDULED, retry_in=-5))
    assert app.sent == [("agent_runner.step_turn", ("t-1", 3), {"queue": "q"})]


@pytest.mark.parametrize(
    "status", [AgentTurnStatus.WAITING_FOR_USER, AgentTurnStatus.WAITING_FOR_CHILD, AgentTurnStatus.COMPLETED]
)
def test_a_turn_that_cannot_run_is_not_sent(status: AgentTurnStatus) -> None:
    app = RecordingApp()
    dispatcher(app).dispatch(turn(status))
    assert app.sent == []


def test_a_failed_publish_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    # The turn is saved already; the sweeps will enqueue it, so the caller must not fail.
    assert dispatcher(RecordingApp(fail=True)).send_step("t-1", 3) is False
    assert "sweeps will pick it up" in caplog.text
    # One warning line naming the error, no traceback: a sweep with the broker down sends many
    [record] = caplog.records
    assert record.levelname == "WARNING" and record.exc_info is None and "broker down" in record.getMessage()


def test_a_terminal_event_of_a_conversation_turn_asks_for_the_next_inbox_message() -> None:
    app = RecordingApp()
    notify = InboxNotifier(dispatcher(app))
    notify(AgentEvent(type=AgentEventType.TURN_COMPLETED, turn_id="t-1", conversation_id="c-1"))
    notify(AgentEvent(type=AgentEventType.TURN_FAILED, turn_id="t-2", conversation_id=None))
    notify(AgentEvent(type=AgentEventType.TURN_SUSPENDED, turn_id="t-3", conversation_id="c-1"))
    assert app.sent == [("agent_runner.dispatch_inbox", ("c-1",), {"queue": "q"})]


def test_the_notifier_asks_only_for_conversations_with_a_message_waiting(caplog: pytest.LogCaptureFixture) -> None:
    # Most conversation turns end with nothing queued: no dispatch_inbox task for those
    waiting = {"c-waiting": True, "c-empty": False}

    def has_waiting(conversation: ConversationKey) -> bool:
        if conversation.conversation_id not in waiting:
            raise StoreUnavailableError("database down")
        return waiting[conversation.conversation_id]

    app = RecordingApp()
    notify = InboxNotifier(dispatcher(app), has_waiting)
    for conversation in ("c-waiting", "c-empty", "c-unknown"):
        notify(
            AgentEvent(type=AgentEventType.TURN_COMPLETED, turn_id=f"t-{conversation}", conversation_id=conversation)
        )

    # An inbox that cannot be read is asked anyway: a lost ask would leave the message to the sweep
    assert [args for _, args, _ in app.sent] == [("c-waiting",), ("c-unknown",)]
    assert "could not read the inbox of c-unknown" in caplog.text


def test_a_soft_time_limit_inside_a_call_becomes_a_recoverable_error() -> None:
    middleware = SoftTimeLimitAsRetry()

    def hang(_: object) -> Any:
        raise SoftTimeLimitExceeded()

    with pytest.raises(RecoverableError, match="soft time limit"):
        middleware.wrap_model(ChatRequest(messages=[], tools=[]), hang)
    with pytest.raises(RecoverableError, match="'slow'"):
        middleware.wrap_tool(ToolCall(id="c", name="slow", arguments={}), hang)
    assert middleware.wrap_tool(ToolCall(id="c", name="fast", arguments={}), lambda call: call.name) == "fast"


def test_a_soft_time_limit_in_a_non_idempotent_tool_leaves_its_outcome_to_a_person() -> None:
    # Given a non-idempotent tool that charged, then hung until the soft time limit fired
    charges: list[int] = []

    def charge(amount: int) -> str:
        charges.append(amount)
        raise SoftTimeLimitExceeded()

    model = ScriptedChatModel([AiMessage(tool_calls=[ToolCall(id="p-1", name="charge", arguments={"amount": 5})])])
    agent = Agent(id="payer", chat_model=model, tools=[Tool(charge, idempotent=False)])
    runner = AgentRunner(middleware=[SoftTimeLimitAsRetry()])

    turn = runner.run(agent, "pay 5")

    # Then the retry the middleware asks for does not run the charge again: a person decides
    assert charges == [5]
    assert turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL
    assert turn.suspension is not None and turn.suspension.is_outcome_unknown
