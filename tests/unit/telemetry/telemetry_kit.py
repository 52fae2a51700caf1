"""The scenario of the telemetry tests, run in-process: a form, an approval, a retry and a child turn.

The assistant asks for a form, then calls a tool that needs approval, then a tool that
fails once with a recoverable error, then delegates to a helper sub-agent (which calls a
tool of its own), then answers. `drive` plays the people and the retry in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
    ChatResponse,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    ToolCall,
    Usage,
    tool,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

DETAILS = AgentFormDefinition(
    key="details",
    description="What to write",
    schema={"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]},
)
MODEL_NAME = "scripted-model-1"
USAGE = Usage(input_tokens=11, output_tokens=7)


class Tracing:
    """An SDK tracer provider that keeps finished spans in memory (imported here: the kit runs without it too)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]


class NamedModel(ScriptedChatModel):
    """A scripted model that says which model it is, as real adapters do with `.model`."""

    def __init__(self, model: str, items: list[Any]) -> None:
        super().__init__(items)
        self.model = model


def _calls(*calls: ToolCall) -> ChatResponse:
    return ChatResponse(message=AiMessage(tool_calls=list(calls)), usage=USAGE)


def build_agent(log: Callable[[str], None] = lambda _: None) -> Agent:
    """A fresh assistant (its script and its flaky tool start over)."""
    failures = {"left": 1}

    @tool(requires_approval=True)
    def approved_write(effect: str) -> str:
        """Write something after a person approved it."""
        log(f"writing {effect}")
        return f"wrote {effect}"

    @tool
    def flaky_write(effect: str) -> str:
        """Fail once, recoverably, then write."""
        if failures["left"]:
            failures["left"] -= 1
            raise RecoverableError("the ledger is busy")
        return f"wrote {effect}"

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    helper = Agent(
        id="helper",
        description="Adds numbers.",
        chat_model=NamedModel(
            "helper-model",
            [
                AiMessage(tool_calls=[ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2})]),
                ChatResponse(message=AiMessage(content="3"), usage=USAGE),
            ],
        ),
        tools=[add],
    )
    model = NamedModel(
        MODEL_NAME,
        [
            _calls(ToolCall(id="f1", name="request_user_input", arguments={"formKey": "details"})),
            _calls(ToolCall(id="a1", name="approved_write", arguments={"effect": "x"})),
            _calls(ToolCall(id="r1", name="flaky_write", arguments={"effect": "y"})),
            _calls(ToolCall(id="d1", name="helper", arguments={"task": "add 1 and 2"})),
            ChatResponse(message=AiMessage(content="all done"), usage=USAGE),
        ],
    )
    return Agent(
        id="assistant",
        chat_model=model,
        tools=[AgentUserInputTool(forms=[DETAILS]), approved_write, flaky_write],
        sub_agents=[helper],
    )


def new_runner(**kwargs: Any) -> AgentRunner:
    """An in-memory runner whose retries are due at once."""
    return AgentRunner(policy=AgentExecutionPolicy(retry=RetryPolicy(initial_backoff=0, jitter=0)), **kwargs)


def start(runner: AgentRunner, agent: Agent) -> AgentTurn:
    turn = runner.run(agent, "write x and y, then add")
    assert turn.status is AgentTurnStatus.WAITING_FOR_USER
    return turn


def finish(runner: AgentRunner, turn_id: str, around: Callable[[str], Any] | None = None) -> AgentTurn:
    """Answer the form, approve, retry: each resume optionally inside `around(name)` (a context manager)."""
    commands = [
        ("form", AgentResumeCommand.user_input("f1", {"value": "v"}), AgentTurnStatus.WAITING_FOR_APPROVAL),
        ("approve", AgentResumeCommand.approve_tool("a1"), AgentTurnStatus.RETRY_SCHEDULED),
        ("retry", AgentResumeCommand.retry(), AgentTurnStatus.COMPLETED),
    ]
    turn = runner.turn_store.load(turn_id)
    for name, command, expected in commands:
        if around is None:
            turn = runner.resume(turn_id, command)
        else:
            with around(name):
                turn = runner.resume(turn_id, command)
        assert turn.status is expected, (name, turn.status, turn.error)
    return turn


def drive(runner: AgentRunner, agent: Agent) -> AgentTurn:
    """The whole scenario, every resume in this thread."""
    return finish(runner, start(runner, agent).id)
