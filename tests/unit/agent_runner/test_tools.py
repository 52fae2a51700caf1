"""Tools: the decorator, argument schemas and validation, the user-input tool, tool results in a turn."""

from __future__ import annotations

from typing import Literal

import pytest

from agent_runner import (
    Agent,
    AgentRunner,
    AgentRunnerError,
    AgentToolContext,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    DefinitionError,
    ScriptedChatModel,
    Tool,
    ToolArgumentsError,
    ToolCall,
    ToolError,
    tool,
)
from tests.unit.agent_runner.turn_kit import TICKET_FORM, tool_messages


@tool
def lookup_order(order_id: str, include_items: bool = False) -> str:
    """Look an order up by its id."""
    return f"order {order_id}"


@tool(name="open_ticket", description="Open an incident ticket.", requires_approval=True)
def create_ticket(affected_system: str, impact_scope: Literal["ONE_USER", "ALL_USERS"]) -> str:
    return "T-1"


def test_bare_tool_takes_its_name_from_the_function_and_description_from_the_docstring() -> None:
    assert isinstance(lookup_order, Tool)
    assert lookup_order.name == "lookup_order"
    assert lookup_order.description == "Look an order up by its id."
    assert lookup_order.requires_approval is False


def test_tool_with_keywords_uses_the_given_name_description_and_approval_flag() -> None:
    assert create_ticket.name == "open_ticket"
    assert create_ticket.description == "Open an incident ticket."
    assert create_ticket.requires_approval is True


def test_decorated_tool_can_still_be_called_as_a_plain_function() -> None:
    assert lookup_order("1001") == "order 1001"


def test_argument_schema_comes_from_type_hints_with_literal_as_enum() -> None:
    # Given: the schema of a tool with a str and a Literal parameter
    schema = create_ticket.spec.parameters
    # Then: types, enum and required fields follow the hints
    assert schema["type"] == "object"
    assert schema["properties"]["affected_system"]["type"] == "string"
    assert schema["properties"]["impact_scope"]["enum"] == ["ONE_USER", "ALL_USERS"]
    assert sorted(schema["required"]) == ["affected_system", "impact_scope"]


def test_parameters_with_defaults_are_optional_in_the_schema() -> None:
    schema = lookup_order.parameters
    assert schema["required"] == ["order_id"]
    assert schema["properties"]["include_items"]["type"] == "boolean"


def test_spec_names_the_tool_for_the_model() -> None:
    spec = create_ticket.spec
    assert (spec.name, spec.description) == ("open_ticket", "Open an incident ticket.")


def test_arguments_outside_the_schema_raise_tool_arguments_error() -> None:
    with pytest.raises(ToolArgumentsError) as caught:
        create_ticket.validate_arguments({"affected_system": "login", "impact_scope": "SOME_USERS"})
    assert caught.value.errors and "impact_scope" in caught.value.errors[0]
    with pytest.raises(ToolArgumentsError):
        lookup_order.validate_arguments({"order_id": "1", "unexpected": True})


def test_a_tool_name_outside_the_allowed_pattern_is_a_definition_error() -> None:
    def noop() -> None:
        return None

    with pytest.raises(DefinitionError):
        tool(name="has spaces")(noop)


def test_a_sensitive_argument_that_does_not_exist_is_a_definition_error() -> None:
    def login(user: str) -> str:
        return user

    with pytest.raises(DefinitionError):
        tool(sensitive=["password"])(login)


def test_user_input_tool_is_named_request_user_input_and_takes_a_form_key() -> None:
    user_input = AgentUserInputTool(forms=[TICKET_FORM])
    assert user_input.name == "request_user_input"
    assert user_input.spec.parameters["required"] == ["formKey"]
    assert TICKET_FORM.key in user_input.spec.description


def test_sub_agents_are_offered_to_the_model_as_tools_named_by_their_id_taking_one_string() -> None:
    # Given: an agent with one sub-agent
    researcher = Agent(id="researcher", description="Finds facts.", chat_model=ScriptedChatModel([]))
    lead = Agent(id="lead", chat_model=ScriptedChatModel([]), tools=[lookup_order], sub_agents=[researcher])
    # Then: the delegation tool is in the specs with one required string argument
    specs = {spec.name: spec for spec in lead.tool_specs()}
    assert set(specs) == {"lookup_order", "researcher"}
    parameters = specs["researcher"].parameters
    assert parameters["properties"]["task"]["type"] == "string"
    assert parameters["required"] == ["task"]


def test_an_agent_id_outside_the_allowed_pattern_is_a_definition_error() -> None:
    with pytest.raises(DefinitionError):
        Agent(id="not valid!")


def test_tool_context_is_not_available_outside_a_tool_run() -> None:
    with pytest.raises(AgentRunnerError):
        AgentToolContext.current()


def test_tool_results_are_json_encoded_unless_they_are_strings() -> None:
    # Given: a tool returning a dict and one returning a string
    @tool
    def totals() -> dict[str, object]:
        """Totals."""
        return {"count": 2, "names": ["a", "é"]}

    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="c1", name="totals", arguments={}),
                    ToolCall(id="c2", name="lookup_order", arguments={"order_id": "7"}),
                ]
            ),
            AiMessage(content="done"),
        ]
    )
    agent = Agent(id="tooling", chat_model=model, tools=[totals, lookup_order])
    # When: the turn runs
    turn = AgentRunner().run(agent, "go")
    # Then: the dict is JSON, the string is kept as it is
    contents = {m.tool_call_id: m.content for m in tool_messages(turn)}
    assert contents == {"c1": '{"count": 2, "names": ["a", "é"]}', "c2": "order 7"}


def test_invalid_arguments_become_an_error_tool_message_and_the_tool_does_not_run() -> None:
    # Given: a tool that records its runs, and a call with a wrong type
    runs: list[int] = []

    @tool
    def count(n: int) -> str:
        """Count."""
        runs.append(n)
        return "ok"

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="count", arguments={"n": "many"})]), AiMessage(content="sorry")]
    )
    agent = Agent(id="tooling", chat_model=model, tools=[count])
    # When: the turn runs
    turn = AgentRunner().run(agent, "go")
    # Then: the model got an error ToolMessage naming the argument, then answered
    [message] = tool_messages(turn)
    assert message.is_error and message.tool_call_id == "c1"
    assert runs == []
    assert turn.status is AgentTurnStatus.COMPLETED and model.calls == 2
    assert model.requests[1].messages[-1] == message


def test_an_unknown_tool_name_becomes_an_error_tool_message() -> None:
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="delete_everything", arguments={})]), AiMessage(content="ok")]
    )
    agent = Agent(id="tooling", chat_model=model, tools=[lookup_order])
    turn = AgentRunner().run(agent, "go")
    [message] = tool_messages(turn)
    assert message.is_error and message.tool_name == "delete_everything"
    assert "delete_everything" in message.content
    assert turn.status is AgentTurnStatus.COMPLETED


def test_a_tool_error_becomes_an_error_tool_message_with_its_text() -> None:
    @tool
    def charge(amount: int) -> str:
        """Charge."""
        raise ToolError("card declined")

    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="c1", name="charge", arguments={"amount": 5})]),
            AiMessage(content="declined"),
        ]
    )
    turn = AgentRunner().run(Agent(id="tooling", chat_model=model, tools=[charge]), "go")
    [message] = tool_messages(turn)
    assert (message.is_error, message.content) == (True, "card declined")
    assert turn.status is AgentTurnStatus.COMPLETED and turn.final_output == "declined"


def test_tool_context_describes_the_running_call() -> None:
    # Given: a tool that reads its context
    seen: list[tuple[str, str, dict[str, object], str]] = []

    @tool
    def inspect_call(x: int) -> str:
        """Inspect."""
        ctx = AgentToolContext.current()
        seen.append((ctx.turn_id, ctx.tool_call.id, ctx.get_submitted_form_data(), ctx.get_idempotency_key()))
        return "ok"

    model = ScriptedChatModel(
        [
            AiMessage(
                tool_calls=[
                    ToolCall(id="c1", name="inspect_call", arguments={"x": 1}),
                    ToolCall(id="c2", name="inspect_call", arguments={"x": 2}),
                ]
            ),
            AiMessage(content="ok"),
        ]
    )
    turn = AgentRunner().run(Agent(id="tooling", chat_model=model, tools=[inspect_call]), "go")
    # Then: turn id and call are right, no form data, and each call has its own key
    assert [(t, c, f) for t, c, f, _ in seen] == [(turn.id, "c1", {}), (turn.id, "c2", {})]
    assert seen[0][3] != seen[1][3]


def test_an_async_tool_runs_to_completion_with_its_context() -> None:
    import asyncio

    from agent_runner import Agent, AgentRunner, AgentToolContext, AiMessage, ScriptedChatModel, ToolCall, tool

    seen: list[str] = []

    # Given an async tool that awaits and reads its context
    @tool
    async def fetch(order_id: str) -> str:
        """Fetch an order."""
        await asyncio.sleep(0)
        seen.append(AgentToolContext.current().get_idempotency_key())
        return f"order {order_id}"

    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="c1", name="fetch", arguments={"order_id": "7"})]), AiMessage(content="ok")]
    )
    # When a turn calls it
    turn = AgentRunner().run(Agent(id="a", chat_model=model, tools=[fetch]), "go")
    # Then its awaited result is the ToolMessage and the context was available inside the coroutine
    assert turn.status == "COMPLETED"
    assert turn.messages[2].content == "order 7"
    assert seen == [f"{turn.id}:c1"]
