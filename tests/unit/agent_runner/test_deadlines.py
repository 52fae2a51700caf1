"""Approval and form deadlines: recorded in the suspension, a reminder once, the default through the resume path."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agent_runner import (
    ActionStatus,
    Agent,
    AgentActionMessage,
    AgentEventType,
    AgentExecutionPolicy,
    AgentFormDefinition,
    AgentFormMessage,
    AgentFormRequiredException,
    AgentResumeCommand,
    AgentRunner,
    AgentSuspension,
    AgentToolContext,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    DefinitionError,
    InMemoryAgentLoader,
    InMemoryAgentTurnStore,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    ScriptedChatModel,
    SuspensionType,
    TimeoutAction,
    ToolCall,
    tool,
)
from agent_runner.persistence import EventScope
from agent_runner.worker import AgentWorker
from tests.unit.agent_runner.turn_kit import EventLog, FakeClock, RecordingStore, protocol_violations, tool_messages

S = AgentTurnStatus
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"system": {"type": "string"}},
    "required": ["system"],
    "additionalProperties": False,
}


class Desk:
    """A runner on a fake clock, with a recording store, chat memory and an event log."""

    def __init__(self, tools: list[Any], script: list[AiMessage], policy: AgentExecutionPolicy | None = None) -> None:
        self.clock = FakeClock()
        self.store = RecordingStore()
        self.memories = InMemoryChatMemoryProvider()
        self.agent = Agent(id="desk", chat_model=ScriptedChatModel(script), tools=tools)
        self.runner = AgentRunner(
            turn_store=self.store,
            agent_loader=InMemoryAgentLoader([self.agent]),
            chat_memory_provider=self.memories,
            policy=policy,
            clock=self.clock,
        )
        self.events = EventLog()
        self.runner.add_event_listener(self.events)
        self.ran: list[str] = []

    def page_message(self, conversation_id: str, message_id: str) -> Any:
        return self.memories(conversation_id).get(message_id)


def _deploy_tool(desk_ran: list[str], on_timeout: str = "reject", timeout: float = 60) -> Any:
    @tool(requires_approval=True, approval_timeout=timeout, on_timeout=on_timeout)
    def deploy(service: str) -> str:
        """Deploy a service."""
        desk_ran.append(service)
        return f"deployed {service}"

    return deploy


def _approval_desk(on_timeout: str = "reject", policy: AgentExecutionPolicy | None = None) -> Desk:
    ran: list[str] = []
    desk = Desk(
        [_deploy_tool(ran, on_timeout)],
        [
            AiMessage(tool_calls=[ToolCall(id="c1", name="deploy", arguments={"service": "api"})]),
            AiMessage(content="finished"),
        ],
        policy,
    )
    desk.ran = ran
    return desk


def test_an_approval_with_a_timeout_records_its_deadline_default_and_reminder_time() -> None:
    # Given a tool whose approval times out after 60 s, on a runner reminding at 80 %
    desk = _approval_desk("approve")

    # When the model calls it
    turn = desk.runner.run("desk", "deploy the api", conversation_id="conv")

    # Then the suspension holds the deadline, the default and the reminder time
    suspension = turn.suspension
    assert turn.status is S.WAITING_FOR_APPROVAL and suspension is not None
    assert suspension.deadline == desk.clock.now + timedelta(seconds=60)
    assert suspension.on_timeout is TimeoutAction.APPROVE
    assert suspension.remind_at == desk.clock.now + timedelta(seconds=48)
    assert suspension.reminded_at is None
    assert turn.wake_at == suspension.remind_at
    suspended = desk.events.of_type(AgentEventType.TURN_SUSPENDED)[-1]
    assert suspended.data["deadline"] == suspension.deadline.isoformat()
    assert suspended.data["on_timeout"] == "approve"


def test_nothing_happens_before_the_reminder_time_and_the_reminder_is_emitted_once() -> None:
    desk = _approval_desk()
    turn = desk.runner.run("desk", "deploy the api")
    version = turn.version

    # Before the reminder time: no change
    desk.clock.advance(47)
    assert desk.runner.apply_deadline(turn.id).version == version
    assert desk.store.list_due_timers(desk.clock.now) == []

    # Past it: one DEADLINE_APPROACHING, saved with the turn, and the turn still waits
    desk.clock.advance(2)
    assert [ref.turn_id for ref in desk.store.list_due_timers(desk.clock.now)] == [turn.id]
    reminded = desk.runner.apply_deadline(turn.id)
    assert reminded.status is S.WAITING_FOR_APPROVAL and reminded.version == version + 1
    assert reminded.suspension is not None and reminded.suspension.reminded_at == desk.clock.now
    assert reminded.wake_at == reminded.suspension.deadline
    (event,) = desk.events.of_type(AgentEventType.DEADLINE_APPROACHING)
    assert event.data["correlation_id"] == "c1" and event.data["on_timeout"] == "reject"
    stored = [e.type for e in desk.store.read_events(EventScope.tree(turn.id))]
    assert stored.count(AgentEventType.DEADLINE_APPROACHING) == 1

    # A second sweep before the deadline does nothing
    desk.clock.advance(5)
    assert desk.store.list_due_timers(desk.clock.now) == []
    assert desk.runner.apply_deadline(turn.id).version == reminded.version
    assert len(desk.events.of_type(AgentEventType.DEADLINE_APPROACHING)) == 1


def test_a_passed_deadline_rejects_through_the_resume_path_decided_by_system() -> None:
    # Given a waiting approval whose default is reject
    desk = _approval_desk("reject")
    turn = desk.runner.run("desk", "deploy the api", conversation_id="conv")

    # When the deadline passes and the sweep applies it
    desk.clock.advance(61)
    resumed = desk.runner.apply_deadline(turn.id)

    # Then the turn is resumed (runnable for a worker), the call answered as not approved, nothing ran
    assert resumed.status is S.RUNNING and resumed.suspension is None
    assert resumed.wake_at is None
    (answer,) = tool_messages(resumed)
    assert answer.is_error and "before its deadline" in answer.content
    assert desk.ran == []
    (action,) = resumed.page_actions
    assert action.status is ActionStatus.REJECTED
    assert action.decision["decided_by"] == "system" and action.decision["reason"] == "deadline passed"
    resume_event = desk.events.of_type(AgentEventType.TURN_RESUMED)[-1]
    assert resume_event.data["command"] == "DEADLINE" and resume_event.data["metadata"]["decided_by"] == "system"

    # And the page card in ChatMemory shows who decided and why
    card = desk.page_message("conv", action.message_id)
    assert isinstance(card, AgentActionMessage)
    assert (card.status, card.decided_by, card.reason) == (ActionStatus.REJECTED, "system", "deadline passed")

    # And the model answers on the next step
    ended = desk.runner.run_until_blocked(resumed)
    assert ended.status is S.COMPLETED and protocol_violations(ended.messages) == []


def test_a_passed_deadline_with_approve_runs_the_saved_call_once() -> None:
    desk = _approval_desk("approve")
    turn = desk.runner.run("desk", "deploy the api")
    desk.clock.advance(120)

    resumed = desk.runner.apply_deadline(turn.id)
    # A second sweep of the same deadline (two beats) changes nothing
    again = desk.runner.apply_deadline(turn.id)
    assert again.version == resumed.version

    ended = desk.runner.run_until_blocked(resumed)
    assert ended.status is S.COMPLETED
    assert desk.ran == ["api"]
    assert [e.data["command"] for e in desk.events.of_type(AgentEventType.TURN_RESUMED)] == ["DEADLINE"]
    assert ended.page_actions[0].status is ActionStatus.APPROVED
    assert ended.page_actions[0].decision["reason"] == "deadline passed"


def test_a_person_who_decides_first_wins_over_the_deadline() -> None:
    desk = _approval_desk("approve")
    turn = desk.runner.run("desk", "deploy the api")
    rejected = desk.runner.submit_resume(
        turn.id, AgentResumeCommand.reject_tool("c1", "not today").with_metadata("approverId", "u-7")
    )
    desk.clock.advance(120)

    after = desk.runner.apply_deadline(turn.id)

    assert after.version == rejected.version
    assert after.page_actions[0].decision["decided_by"] == "u-7"
    assert [e.data["command"] for e in desk.events.of_type(AgentEventType.TURN_RESUMED)] == ["REJECT_TOOL"]


def test_the_deadline_command_is_refused_before_the_deadline_and_without_one() -> None:
    desk = _approval_desk()
    turn = desk.runner.run("desk", "deploy the api")
    with pytest.raises(InvalidResumeCommand, match="has not passed"):
        desk.runner.submit_resume(turn.id, AgentResumeCommand.deadline_passed("c1"))
    desk.clock.advance(61)
    with pytest.raises(InvalidResumeCommand):
        desk.runner.submit_resume(turn.id, AgentResumeCommand.deadline_passed("other-call"))
    assert desk.store.load(turn.id).version == turn.version

    # A call without a timeout has no deadline to pass
    plain = Desk(
        [_plain_approval()],
        [AiMessage(tool_calls=[ToolCall(id="c9", name="restart", arguments={})]), AiMessage(content="ok")],
    )
    waiting = plain.runner.run("desk", "restart")
    assert waiting.suspension is not None and waiting.suspension.deadline is None and waiting.wake_at is None
    with pytest.raises(InvalidResumeCommand, match="without a deadline"):
        plain.runner.submit_resume(waiting.id, AgentResumeCommand.deadline_passed("c9"))


def _plain_approval() -> Any:
    @tool(requires_approval=True)
    def restart() -> str:
        """Restart."""
        return "restarted"

    return restart


def test_a_form_deadline_submits_its_default_data() -> None:
    form = AgentFormDefinition(
        key="details", schema=SCHEMA, timeout=timedelta(minutes=5), on_timeout="submit", default_data={"system": "any"}
    )
    desk = Desk(
        [AgentUserInputTool(forms=[form])],
        [
            AiMessage(tool_calls=[ToolCall(id="f1", name="request_user_input", arguments={"formKey": "details"})]),
            AiMessage(content="filed"),
        ],
    )
    turn = desk.runner.run("desk", "file it", conversation_id="c")
    assert turn.suspension is not None and turn.suspension.on_timeout is TimeoutAction.SUBMIT
    assert turn.suspension.deadline == desk.clock.now + timedelta(minutes=5)

    desk.clock.advance(301)
    resumed = desk.runner.apply_deadline(turn.id)

    (answer,) = tool_messages(resumed)
    assert answer.content == '{"system": "any"}' and not answer.is_error
    card = desk.page_message("c", resumed.page_actions[0].message_id)
    assert isinstance(card, AgentFormMessage)
    assert (card.status, card.decided_by, card.reason) == (ActionStatus.SUBMITTED, "system", "deadline passed")
    assert desk.runner.run_until_blocked(resumed).status is S.COMPLETED


def test_a_form_deadline_that_rejects_tells_the_model_nobody_answered() -> None:
    form = AgentFormDefinition(key="details", schema=SCHEMA, timeout=30)
    desk = Desk(
        [AgentUserInputTool(forms=[form])],
        [
            AiMessage(tool_calls=[ToolCall(id="f1", name="request_user_input", arguments={"formKey": "details"})]),
            AiMessage(content="no details, closing"),
        ],
    )
    turn = desk.runner.run("desk", "file it")
    desk.clock.advance(31)
    resumed = desk.runner.apply_deadline(turn.id)

    (answer,) = tool_messages(resumed)
    assert answer.is_error and "Nobody filled in the form 'details'" in answer.content
    assert resumed.page_actions[0].status is ActionStatus.REJECTED
    assert desk.runner.run_until_blocked(resumed).final_output == "no details, closing"


def test_a_form_a_tool_requires_times_out_too_and_the_tool_does_not_run() -> None:
    form = AgentFormDefinition(key="confirm", schema=SCHEMA, timeout=10)
    calls: list[dict[str, Any]] = []

    @tool
    def open_ticket() -> str:
        """Open a ticket once the user confirmed the system."""
        data = AgentToolContext.current().get_submitted_form_data()
        calls.append(data)
        if not data:
            raise AgentFormRequiredException(form)
        return "opened"

    desk = Desk(
        [open_ticket],
        [AiMessage(tool_calls=[ToolCall(id="t1", name="open_ticket", arguments={})]), AiMessage(content="gave up")],
    )
    turn = desk.runner.run("desk", "open a ticket")
    assert turn.status is S.WAITING_FOR_USER and turn.suspension is not None
    assert turn.suspension.type is SuspensionType.USER_INPUT and turn.suspension.deadline is not None

    desk.clock.advance(11)
    ended = desk.runner.run_until_blocked(desk.runner.apply_deadline(turn.id))

    assert calls == [{}]
    assert ended.final_output == "gave up" and tool_messages(ended)[0].is_error


def test_without_a_reminder_fraction_the_deadline_is_the_only_wake_up() -> None:
    desk = _approval_desk(policy=AgentExecutionPolicy(deadline_reminder=None))
    turn = desk.runner.run("desk", "deploy the api")
    assert turn.suspension is not None and turn.suspension.remind_at is None
    assert turn.wake_at == turn.suspension.deadline
    desk.clock.advance(59)
    assert desk.runner.apply_deadline(turn.id).version == turn.version
    assert desk.events.of_type(AgentEventType.DEADLINE_APPROACHING) == []


def test_a_cancelled_turn_has_no_deadline_left() -> None:
    desk = _approval_desk()
    turn = desk.runner.run("desk", "deploy the api")
    cancelled = desk.runner.cancel(turn.id)
    desk.clock.advance(120)
    assert cancelled.wake_at is None
    assert desk.store.list_due_timers(desk.clock.now) == []
    assert desk.runner.apply_deadline(turn.id).version == cancelled.version


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tool(name="t", requires_approval=False, approval_timeout=5)(lambda: None), "needs requires_approval"),
        (lambda: tool(name="t", requires_approval=True, approval_timeout=0)(lambda: None), "must be positive"),
        (
            lambda: tool(name="t", requires_approval=True, approval_timeout=5, on_timeout="x")(lambda: None),
            "on_timeout",
        ),
        (lambda: AgentFormDefinition(key="f", timeout=-1), "must be positive"),
        (lambda: AgentFormDefinition(key="f", timeout=5, on_timeout="submit"), "needs default_data"),
        (
            lambda: AgentFormDefinition(key="f", schema=SCHEMA, timeout=5, on_timeout="submit", default_data={}),
            "does not match",
        ),
        (lambda: AgentFormDefinition(key="f", timeout=5, on_timeout="approve"), "on_timeout"),
    ],
)
def test_timeouts_are_checked_when_tools_and_forms_are_defined(build: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        build()


def test_a_suspension_deadline_needs_a_default_that_fits_it() -> None:
    moment = FakeClock().now
    with pytest.raises(ValueError, match="set together"):
        AgentSuspension(type=SuspensionType.TOOL_APPROVAL, correlation_id="c", deadline=moment)
    with pytest.raises(ValueError, match="does not apply"):
        AgentSuspension(
            type=SuspensionType.TOOL_APPROVAL, correlation_id="c", deadline=moment, on_timeout=TimeoutAction.SUBMIT
        )
    with pytest.raises(ValueError, match="tool approval or a form"):
        AgentSuspension(type=SuspensionType.USER_INPUT, deadline=moment, on_timeout=TimeoutAction.REJECT)


def test_a_suspension_with_a_deadline_survives_a_json_round_trip() -> None:
    form = AgentFormDefinition(key="f", schema=SCHEMA, timeout=7, on_timeout="submit", default_data={"system": "x"})
    desk = Desk(
        [AgentUserInputTool(forms=[form])],
        [AiMessage(tool_calls=[ToolCall(id="f1", name="request_user_input", arguments={"formKey": "f"})])],
    )
    turn = desk.runner.run("desk", "go")
    again = type(turn).model_validate_json(turn.model_dump_json())
    assert again == turn
    assert again.suspension is not None and again.suspension.form is not None
    assert again.suspension.form.timeout == timedelta(seconds=7)
    assert again.suspension.form.default_data == {"system": "x"}


def test_a_start_with_a_chosen_id_happens_once_and_the_id_follows_the_id_rules() -> None:
    from agent_runner import InputLimitError, VersionConflictError

    desk = _approval_desk()
    first = desk.runner.start("desk", "deploy the api", turn_id="tick-2030-01-01T12.00")
    assert first.id == "tick-2030-01-01T12.00"
    with pytest.raises(VersionConflictError):
        desk.runner.start("desk", "deploy the api", turn_id="tick-2030-01-01T12.00")
    with pytest.raises(InputLimitError):
        desk.runner.start("desk", "deploy the api", turn_id="has spaces")
    assert len(desk.store.list_turns()) == 1


def test_the_sweep_sends_the_reminder_then_applies_the_default_and_counts_what_it_handled() -> None:
    # Given a waiting approval (60 s, reminder at 80 %) that is approved by default
    desk = _approval_desk("approve")
    turn = desk.runner.run("desk", "deploy the api")

    # Before the reminder time the sweep finds nothing; past it, it reminds once
    desk.clock.advance(30)
    assert desk.runner.apply_due_deadlines() == 0
    desk.clock.advance(20)
    assert desk.runner.apply_due_deadlines() == 1
    assert desk.runner.apply_due_deadlines() == 0
    assert len(desk.events.of_type(AgentEventType.DEADLINE_APPROACHING)) == 1

    # Past the deadline it applies the default, once
    desk.clock.advance(11)
    assert desk.runner.apply_due_deadlines() == 1
    assert desk.runner.apply_due_deadlines() == 0
    resumed = desk.store.load(turn.id)
    assert resumed.status is S.RUNNING and resumed.page_actions[0].status is ActionStatus.APPROVED


def test_an_embedded_worker_pass_applies_a_passed_deadline_and_steps_the_turn_on() -> None:
    # Given a waiting approval whose default is approve, and an embedded worker on the runner
    desk = _approval_desk("approve")
    worker = AgentWorker(desk.runner)
    turn = desk.runner.run("desk", "deploy the api")

    # When a pass runs at the reminder time, then after the deadline
    desk.clock.advance(50)
    assert worker.run_once() == 0
    desk.clock.advance(11)
    steps = worker.run_once()

    # Then the reminder was sent, and the default approved the call, which the same pass ran
    assert len(desk.events.of_type(AgentEventType.DEADLINE_APPROACHING)) == 1
    ended = desk.store.load(turn.id)
    assert steps == 2 and ended.status is S.COMPLETED and desk.ran == ["api"]
    assert ended.page_actions[0].decision == {
        "decided_at": desk.clock.now.isoformat(),
        "decided_by": "system",
        "reason": "deadline passed",
    }


def test_a_worker_without_a_deadline_interval_leaves_deadlines_to_someone_else() -> None:
    desk = _approval_desk("approve")
    worker = AgentWorker(desk.runner, deadline_interval=None)
    turn = desk.runner.run("desk", "deploy the api")
    desk.clock.advance(120)

    assert worker.run_once() == 0
    assert desk.store.load(turn.id).status is S.WAITING_FOR_APPROVAL
    assert desk.events.of_type(AgentEventType.DEADLINE_APPROACHING) == []


class _StoreWithoutTimers:
    """A turn store of someone else's that cannot list due deadlines (only what the worker needs)."""

    def __init__(self) -> None:
        self._turns = InMemoryAgentTurnStore()

    def __getattr__(self, name: str) -> Any:
        if name == "list_due_timers":
            raise AttributeError(name)
        return getattr(self._turns, name)


def test_a_store_that_cannot_list_deadlines_has_no_sweep() -> None:
    runner = AgentRunner(turn_store=_StoreWithoutTimers())
    with pytest.raises(DefinitionError, match="cannot list due deadlines"):
        runner.apply_due_deadlines()
    worker = AgentWorker(runner, deadline_interval=5.0)
    assert worker.deadline_interval is None
    assert worker.run_once() == 0


def test_a_deadline_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="deadline_interval"):
        AgentWorker(AgentRunner(), deadline_interval=0)
