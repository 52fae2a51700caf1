"""The API's view of a turn validates against the model of its OpenAPI schema, in every turn status."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import BaseModel

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    Budget,
    ChatResponse,
    InMemoryChatMemoryProvider,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    ToolCall,
    Usage,
    tool,
)
from tests.unit.agent_runner.turn_kit import FakeClock
from workers.api.bodies import TurnView
from workers.views import turn_view

S = AgentTurnStatus
FORM = AgentFormDefinition(
    key="ticket",
    description="Ticket details",
    schema={"type": "object", "properties": {"system": {"type": "string"}}, "required": ["system"]},
)


@tool(requires_approval=True, sensitive=["token"])
def deploy(service: str, token: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def _call(call_id: str, name: str, **arguments: str) -> AiMessage:
    return AiMessage(tool_calls=[ToolCall(id=call_id, name=name, arguments=arguments)])


def _agent(script: list[AiMessage | ChatResponse | BaseException], **options: object) -> Agent:
    deputy = Agent(
        id="deputy", chat_model=ScriptedChatModel([_call("x1", "deploy", service="api", token="t")]), tools=[deploy]
    )
    return Agent(
        id="ops",
        chat_model=ScriptedChatModel([*script, AiMessage(content="done")]),
        tools=[deploy, lookup, AgentUserInputTool(forms=[FORM])],
        sub_agents=[deputy],
        **options,  # type: ignore[arg-type]
    )


def _runner(max_steps: int = 200) -> AgentRunner:
    return AgentRunner(
        chat_memory_provider=InMemoryChatMemoryProvider(),
        policy=AgentExecutionPolicy(max_steps=max_steps, retry=RetryPolicy(jitter=0)),
        clock=FakeClock(),
    )


def _run(script: list[AiMessage | ChatResponse | BaseException], **options: object) -> AgentTurn:
    runner = _runner()
    return runner.run_until_blocked(runner.start(_agent(script, **options), "hi", conversation_id="c"))


def _ready() -> AgentTurn:
    return _runner().start(_agent([]), "hi", conversation_id="c")


def _running() -> AgentTurn:
    runner = _runner()
    return runner.step(runner.start(_agent([_call("l1", "lookup", query="q")]), "hi")).turn


def _cancelled() -> AgentTurn:
    runner = _runner()
    waiting = runner.run(_agent([_call("c1", "deploy", service="api", token="t")]), "hi")
    return runner.cancel(waiting.id, "not needed")


def _max_steps() -> AgentTurn:
    runner = _runner(max_steps=1)
    return runner.run(_agent([_call("l1", "lookup", query="q"), _call("l2", "lookup", query="r")]), "hi")


def _question() -> AgentTurn:
    runner = _runner()
    turn = runner.run(_agent([_call("u1", "request_user_input", formKey="ticket")]), "hi")
    return runner.resume(turn.id, AgentResumeCommand.user_input("u1", {"system": "db"}))


TURNS: dict[AgentTurnStatus, Callable[[], AgentTurn]] = {
    S.READY: _ready,
    S.RUNNING: _running,
    S.WAITING_FOR_USER: lambda: _run([_call("u1", "request_user_input", formKey="ticket")]),
    S.WAITING_FOR_APPROVAL: lambda: _run([_call("c1", "deploy", service="api", token="secret")]),
    S.WAITING_FOR_CHILD: lambda: _run([_call("d1", "deputy", task="deploy the api")]),
    S.RETRY_SCHEDULED: lambda: _run([RecoverableError("timeout")]),
    S.COMPLETED: _question,
    S.FAILED: lambda: _run([RuntimeError("model exploded")]),
    S.CANCELLED: _cancelled,
    S.MAX_ITERATIONS_REACHED: lambda: _run(
        [_call("l1", "lookup", query="q"), _call("l2", "lookup", query="r")], max_iterations=1
    ),
    S.MAX_STEPS_REACHED: _max_steps,
    S.BUDGET_EXCEEDED: lambda: _run(
        [ChatResponse(message=_call("l1", "lookup", query="q"), usage=Usage(input_tokens=50))],
        budget=Budget(max_total_tokens=10),
    ),
}


def undocumented(value: object, path: str = "turn") -> list[str]:
    """The fields of a validated view, at any depth, that its models do not declare (they allow extra fields)."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{name}" for name in value.model_extra or {}]
        for name in type(value).model_fields:
            found += undocumented(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += undocumented(item, f"{path}[{index}]")
    return found


def test_the_undocumented_field_finder_sees_an_extra_field() -> None:
    assert undocumented(TurnView.model_validate({**turn_view(_ready(), None), "surprise": 1})) == ["turn.surprise"]


def test_every_status_has_a_turn_to_view() -> None:
    assert set(TURNS) == set(AgentTurnStatus)


@pytest.mark.parametrize("status", list(AgentTurnStatus))
def test_the_turn_view_validates_against_its_documented_model(status: AgentTurnStatus) -> None:
    turn = TURNS[status]()
    assert turn.status is status
    for messages in (False, True):
        view = turn_view(turn, None, messages=messages)
        validated = TurnView.model_validate(view)
        # The model documents every field the view sends, at every level, and adds nothing.
        assert undocumented(validated) == []
        assert validated.model_dump(mode="json", by_alias=True, exclude_unset=True) == view
        assert validated.status is status
