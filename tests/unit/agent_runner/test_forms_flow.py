"""Forms in a turn: request_user_input and tools that raise AgentFormRequiredException."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentFormDefinition,
    AgentFormRequiredException,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    FormProtocolError,
    InvalidResumeCommand,
    Phase,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    SuspensionType,
    ToolCall,
    tool,
)
from tests.unit.agent_runner.turn_kit import (
    TICKET_FORM,
    TICKET_SCHEMA,
    VALID_TICKET,
    FakeClock,
    protocol_violations,
    tool_messages,
)

S = AgentTurnStatus

SHIPPING_FORM = AgentFormDefinition(
    key="shipping_address",
    description="Where to ship",
    schema={
        "type": "object",
        "properties": {
            "street": {"type": "string", "minLength": 1},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        },
        "required": ["street", "zip"],
        "additionalProperties": False,
    },
)
ADDRESS = {"street": "Main St 1", "zip": "12345"}


class Shipper:
    """A tool that needs a form before it can ship, and records every start and every side effect."""

    def __init__(self, *, always_ask: bool = False, fail_first_rerun: bool = False) -> None:
        self.starts: list[dict[str, Any]] = []
        self.shipped: list[tuple[str, dict[str, Any]]] = []
        self.keys: list[str] = []
        always, flaky = always_ask, [fail_first_rerun]

        @tool
        def ship(order_id: str) -> str:
            """Ship an order."""
            ctx = AgentToolContext.current()
            data = ctx.get_submitted_form_data()
            self.starts.append(data)
            self.keys.append(ctx.get_idempotency_key())
            if not data or always:
                raise AgentFormRequiredException(SHIPPING_FORM)
            if flaky[0]:
                flaky[0] = False
                raise RecoverableError("carrier timeout")
            self.shipped.append((order_id, data))
            return f"shipped {order_id} to {data['street']}"

        self.tool = ship


def _shipping_turn(shipper: Shipper, *, clock: FakeClock | None = None) -> tuple[AgentRunner, ScriptedChatModel, str]:
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="s1", name="ship", arguments={"order_id": "O-1"})]),
            AiMessage(content="Shipped."),
        ]
    )
    policy = AgentExecutionPolicy(retry=RetryPolicy(jitter=0))
    runner = AgentRunner(policy=policy, clock=clock or FakeClock())
    turn = runner.run(Agent(id="shop", chat_model=model, tools=[shipper.tool]), "ship O-1")
    return runner, model, turn.id


def test_a_tool_asking_for_a_form_suspends_for_user_input_with_the_form_frozen() -> None:
    # Given / When: a tool that raises AgentFormRequiredException
    shipper = Shipper()
    runner, _, turn_id = _shipping_turn(shipper)
    turn = runner.turn_store.load(turn_id)
    # Then: the turn waits for user input on that call, with the full schema, and wrote no ToolMessage
    assert turn.status is S.WAITING_FOR_USER
    assert turn.suspension is not None
    assert (turn.suspension.type, turn.suspension.correlation_id) == (SuspensionType.USER_INPUT, "s1")
    assert turn.suspension.form == SHIPPING_FORM
    assert turn.suspension.resume_phase is Phase.TOOLS
    assert tool_messages(turn) == []
    assert shipper.starts == [{}]
    assert shipper.shipped == []


def test_on_submit_the_tool_reruns_from_its_start_with_the_submitted_data() -> None:
    # Given: the tool waiting for its form
    shipper = Shipper()
    runner, model, turn_id = _shipping_turn(shipper)
    # When: the form is submitted
    turn = runner.resume(turn_id, AgentResumeCommand.user_input("s1", ADDRESS))
    # Then: the tool ran again from its start, saw the data, and its one ToolMessage is its result
    assert shipper.starts == [{}, ADDRESS]
    assert shipper.shipped == [("O-1", ADDRESS)]
    [message] = tool_messages(turn)
    assert (message.tool_call_id, message.content, message.is_error) == ("s1", "shipped O-1 to Main St 1", False)
    assert turn.status is S.COMPLETED and model.calls == 2
    assert len(set(shipper.keys)) == 1


def test_the_tool_message_is_written_only_when_the_rerun_succeeds() -> None:
    # Given: a tool whose first re-run after the form hits a recoverable error
    shipper = Shipper(fail_first_rerun=True)
    runner, _, turn_id = _shipping_turn(shipper)
    # When: the form is submitted
    turn = runner.resume(turn_id, AgentResumeCommand.user_input("s1", ADDRESS))
    # Then: a retry is scheduled and there is still no ToolMessage for the call
    assert turn.status is S.RETRY_SCHEDULED
    assert tool_messages(turn) == []
    # When: it is retried
    turn = runner.resume(turn_id, AgentResumeCommand.retry())
    # Then: the data was still there, and exactly one ToolMessage was written
    assert shipper.starts == [{}, ADDRESS, ADDRESS]
    assert shipper.shipped == [("O-1", ADDRESS)]
    assert [m.tool_call_id for m in tool_messages(turn)] == ["s1"]
    assert turn.status is S.COMPLETED


def test_a_second_form_request_for_the_same_call_fails_the_turn_with_a_form_protocol_error() -> None:
    # Given: a tool that asks for its form again even after it was submitted
    shipper = Shipper(always_ask=True)
    runner, _, turn_id = _shipping_turn(shipper)
    submitted = runner.submit_resume(turn_id, AgentResumeCommand.user_input("s1", ADDRESS))
    # When: the tool step runs
    result = runner.step(submitted)
    # Then: the step error is a FormProtocolError and the turn FAILED with its history closed out
    assert isinstance(result.error, FormProtocolError)
    assert result.error.tool_call_id == "s1"
    assert result.turn.status is S.FAILED
    assert result.turn.error is not None
    [closing] = tool_messages(result.turn)
    assert closing.tool_call_id == "s1" and closing.is_error
    assert protocol_violations(result.turn.messages) == []
    assert runner.turn_store.load(turn_id) == result.turn


def test_form_data_for_a_tool_form_that_fails_the_schema_is_rejected_and_changes_nothing() -> None:
    shipper = Shipper()
    runner, _, turn_id = _shipping_turn(shipper)
    before = runner.turn_store.load(turn_id)
    with pytest.raises(InvalidResumeCommand) as caught:
        runner.resume(turn_id, AgentResumeCommand.user_input("s1", {"street": "Main", "zip": "12"}))
    assert caught.value.errors and "zip" in caught.value.errors[0]
    assert runner.turn_store.load(turn_id) == before
    assert shipper.starts == [{}]


def _input_agent(call: ToolCall) -> tuple[AgentRunner, ScriptedChatModel, Agent]:
    model = ScriptedChatModel([AiMessage(tool_calls=[call]), AiMessage(content="ok"), AiMessage(content="ok")])
    agent = Agent(id="intake", chat_model=model, tools=[AgentUserInputTool(forms=[TICKET_FORM, SHIPPING_FORM])])
    return AgentRunner(), model, agent


def test_an_unknown_form_key_is_answered_with_an_error_tool_message_instead_of_a_suspension() -> None:
    # Given: the model asks for a form that is not registered
    runner, model, agent = _input_agent(
        ToolCall(id="u1", name="request_user_input", arguments={"formKey": "no_such_form"})
    )
    # When: the turn runs
    turn = runner.run(agent, "help")
    # Then: it did not suspend; the model was told the known keys and answered
    assert turn.status is S.COMPLETED
    [message] = tool_messages(turn)
    assert message.is_error and message.tool_call_id == "u1"
    assert TICKET_FORM.key in message.content and SHIPPING_FORM.key in message.content
    assert model.calls == 2


def test_the_frozen_form_schema_never_comes_from_the_model() -> None:
    # Given: the model tries to send its own schema along with the form key
    loose = {"type": "object"}
    runner, _, agent = _input_agent(
        ToolCall(id="u1", name="request_user_input", arguments={"formKey": TICKET_FORM.key, "schema": loose})
    )
    # When: the turn runs
    turn = runner.run(agent, "help")
    # Then: either the call is refused, or the registered schema is the one frozen
    if turn.suspension is not None:
        assert turn.suspension.form is not None and turn.suspension.form.schema == TICKET_SCHEMA
    else:
        assert tool_messages(turn)[0].is_error


def test_form_data_for_request_user_input_becomes_the_tool_message_and_the_turn_returns_to_model() -> None:
    # Given: the turn waiting for the ticket form
    runner, model, agent = _input_agent(
        ToolCall(id="u1", name="request_user_input", arguments={"formKey": TICKET_FORM.key})
    )
    turn = runner.run(agent, "help")
    # When: the data is submitted without running
    turn = runner.submit_resume(turn.id, AgentResumeCommand.user_input("u1", VALID_TICKET))
    # Then: the ToolMessage holds the data and the next step is a model call
    [message] = tool_messages(turn)
    assert json.loads(message.content) == VALID_TICKET and not message.is_error
    assert turn.phase is Phase.MODEL and turn.pending_tool_calls == []
    assert runner.step(turn).response is not None


def test_a_declined_form_of_a_tool_that_takes_no_declines_is_answered_for_the_model_without_a_rerun() -> None:
    # Given: the tool waiting for its form
    shipper = Shipper()
    runner, model, turn_id = _shipping_turn(shipper)
    # When: the person declines it
    turn = runner.resume(turn_id, AgentResumeCommand.reject_tool("s1", "I will pick it up"))
    # Then: the tool did not run again; the model read the decline and answered
    assert shipper.starts == [{}] and shipper.shipped == []
    [message] = tool_messages(turn)
    assert message.is_error
    assert message.content == "The user declined the form 'shipping_address': I will pick it up"
    assert turn.status is S.COMPLETED and model.calls == 2
    [card] = [a for a in turn.page_actions if a.action_id == "s1"]
    assert card.status.value == "REJECTED"


def test_a_tool_that_takes_declines_runs_again_and_reads_that_its_form_was_declined() -> None:
    seen: list[tuple[bool, dict[str, Any]]] = []

    @tool
    def ship(order_id: str) -> str:
        """Ship an order."""
        ctx = AgentToolContext.current()
        seen.append((ctx.form_declined, ctx.get_submitted_form_data()))
        if ctx.form_declined:
            return f"{order_id} kept for pick-up"
        raise AgentFormRequiredException(SHIPPING_FORM, takes_decline=True, state={"asked": 1})

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="s1", name="ship", arguments={"order_id": "O-2"})]), AiMessage(content="ok")]
    )
    runner = AgentRunner(clock=FakeClock())
    turn = runner.run(Agent(id="shop", chat_model=model, tools=[ship]), "ship O-2")
    assert turn.status is S.WAITING_FOR_USER
    with pytest.raises(InvalidResumeCommand, match="waits on tool call 's1', not 'other'"):
        runner.resume(turn.id, AgentResumeCommand.reject_tool("other"))

    turn = runner.resume(turn.id, AgentResumeCommand.reject_tool("s1"))

    assert seen == [(False, {}), (True, {})]
    [message] = tool_messages(turn)
    assert (message.content, message.is_error) == ("O-2 kept for pick-up", False)
    assert turn.status is S.COMPLETED and turn.tool_state == {}
