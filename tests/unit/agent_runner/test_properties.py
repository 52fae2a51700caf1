"""Property: random models and random resume commands never break the turn's invariants.

After every step, resume and cancel: the model-visible history is protocol-valid, every
save advanced the version by exactly one, nothing is saved after a terminal status, no
tool call had its side effect twice, and ChatMemory mirrors the turn without duplicates.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentFormDefinition,
    AgentFormRequiredException,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurn,
    AgentUserInputTool,
    AiMessage,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    RecoverableError,
    RetryPolicy,
    ScriptedChatModel,
    SuspensionType,
    Tool,
    ToolCall,
    tool,
)
from tests.unit.agent_runner.turn_kit import FakeClock, RecordingStore, protocol_violations

DETAILS = AgentFormDefinition(
    key="details",
    schema={
        "type": "object",
        "properties": {"x": {"type": "integer"}},
        "required": ["x"],
        "additionalProperties": False,
    },
)
CALL_KINDS = [
    "approve",
    "plain",
    "flaky",
    "form_tool",
    "greedy_form",
    "user_input",
    "bad_form_key",
    "unknown",
    "bad_args",
]


@dataclass
class World:
    """Tools whose side effects are counted per idempotency key."""

    executions: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    approved: set[str] = field(default_factory=set)
    approval_runs: list[str] = field(default_factory=list)

    def tools(self) -> list[Tool | AgentUserInputTool]:
        @tool(requires_approval=True)
        def approve_me(n: int) -> str:
            """Needs approval."""
            ctx = AgentToolContext.current()
            self.executions[ctx.get_idempotency_key()] += 1
            self.approval_runs.append(ctx.tool_call.id)
            return "approved work done"

        @tool
        def fetch(n: int, flaky: bool = False) -> str:
            """Plain, optionally failing once."""
            key = AgentToolContext.current().get_idempotency_key()
            self.attempts[key] += 1
            if flaky and self.attempts[key] == 1:
                raise RecoverableError("tool timeout")
            self.executions[key] += 1
            return f"fetched {n}"

        @tool
        def configure() -> str:
            """Needs a form first."""
            ctx = AgentToolContext.current()
            data = ctx.get_submitted_form_data()
            if not data:
                raise AgentFormRequiredException(DETAILS)
            self.executions[ctx.get_idempotency_key()] += 1
            return f"configured {data['x']}"

        @tool
        def configure_twice() -> str:
            """Asks for its form on every run (a protocol error after the first submission)."""
            raise AgentFormRequiredException(DETAILS)

        return [approve_me, fetch, configure, configure_twice, AgentUserInputTool(forms=[DETAILS])]


def _call(kind: str, call_id: str) -> ToolCall:
    match kind:
        case "approve":
            return ToolCall(id=call_id, name="approve_me", arguments={"n": 1})
        case "plain":
            return ToolCall(id=call_id, name="fetch", arguments={"n": 1})
        case "flaky":
            return ToolCall(id=call_id, name="fetch", arguments={"n": 2, "flaky": True})
        case "form_tool":
            return ToolCall(id=call_id, name="configure", arguments={})
        case "greedy_form":
            return ToolCall(id=call_id, name="configure_twice", arguments={})
        case "user_input":
            return ToolCall(id=call_id, name="request_user_input", arguments={"formKey": "details"})
        case "bad_form_key":
            return ToolCall(id=call_id, name="request_user_input", arguments={"formKey": "nope"})
        case "unknown":
            return ToolCall(id=call_id, name="no_such_tool", arguments={})
        case _:
            return ToolCall(id=call_id, name="fetch", arguments={"n": "not a number"})


_calls = st.lists(st.sampled_from(CALL_KINDS), min_size=1, max_size=3).map(lambda kinds: ("calls", *kinds))
responses = st.one_of(st.just(("final",)), st.just(("recoverable",)), _calls, _calls, _calls)


def _script(specs: list[tuple[str, ...]]) -> list[AiMessage | BaseException]:
    items: list[AiMessage | BaseException] = []
    counter = 0
    for spec in specs:
        if spec[0] == "final":
            items.append(AiMessage(content="final answer"))
        elif spec[0] == "recoverable":
            items.append(RecoverableError("model timeout"))
        else:
            calls = []
            for kind in spec[1:]:
                counter += 1
                calls.append(_call(kind, f"k{counter}"))
            items.append(AiMessage(content="working", tool_calls=calls))
    return items + [AiMessage(content="wrap up")] * 12


def _valid_command(turn: AgentTurn, choice: str) -> AgentResumeCommand:
    suspension = turn.suspension
    assert suspension is not None
    if suspension.type is SuspensionType.TOOL_APPROVAL:
        assert suspension.correlation_id is not None
        if choice == "reject":
            return AgentResumeCommand.reject_tool(suspension.correlation_id, "not now")
        return AgentResumeCommand.approve_tool(suspension.correlation_id)
    if suspension.type is SuspensionType.USER_INPUT:
        assert suspension.correlation_id is not None
        return AgentResumeCommand.user_input(suspension.correlation_id, {"x": 7})
    return AgentResumeCommand.retry()


def _invalid_commands(turn: AgentTurn) -> list[AgentResumeCommand]:
    suspension = turn.suspension
    assert suspension is not None
    corr = suspension.correlation_id or "none"
    stale = [AgentResumeCommand.approve_tool("stale"), AgentResumeCommand.user_input("stale", {"x": 1})]
    match suspension.type:
        case SuspensionType.TOOL_APPROVAL:
            return [*stale, AgentResumeCommand.retry(), AgentResumeCommand.user_input(corr, {"x": 1})]
        case SuspensionType.USER_INPUT:
            return [
                *stale,
                AgentResumeCommand.approve_tool(corr),
                AgentResumeCommand.user_input(corr, {"x": "seven"}),
                AgentResumeCommand.user_input("plain text"),
            ]
        case _:
            return [*stale, AgentResumeCommand.reject_tool(corr), AgentResumeCommand.child_completed("nobody")]


class Harness:
    """One random turn and the checks run after every operation on it."""

    def __init__(self, specs: list[tuple[str, ...]]) -> None:
        self.world = World()
        self.store = RecordingStore()
        self.clock = FakeClock()
        self.provider = InMemoryChatMemoryProvider()
        policy = AgentExecutionPolicy(max_steps=30, retry=RetryPolicy(max_attempts=3, initial_backoff=1, jitter=0))
        self.runner = AgentRunner(
            turn_store=self.store, chat_memory_provider=self.provider, policy=policy, clock=self.clock
        )
        self.model = ScriptedChatModel(_script(specs))
        self.agent = Agent(id="random", chat_model=self.model, tools=self.world.tools(), max_iterations=6)
        self.turn_id = self.runner.start(self.agent, "go", conversation_id="c").id

    @property
    def turn(self) -> AgentTurn:
        return self.store.load(self.turn_id)

    def check(self) -> None:
        turn = self.turn
        pending = [c.id for c in turn.pending_tool_calls]
        assert protocol_violations(turn.messages, pending) == [], turn.messages
        saves = self.store.saves_of(self.turn_id)
        assert [t.version for t in saves] == list(range(len(saves)))
        assert (turn.version, turn.status) == (saves[-1].version, saves[-1].status)
        terminal = [index for index, saved in enumerate(saves) if saved.is_terminal]
        assert terminal in ([], [len(saves) - 1])
        if turn.is_terminal:
            assert pending == [] and turn.suspension is None
        assert all(count == 1 for count in self.world.executions.values())
        assert set(self.world.approval_runs) <= self.world.approved
        memory = self.provider("c").get_messages(10_000)
        assert [m.id for m in memory if m.model_visible] == [m.id for m in turn.messages]
        actions = Counter(m.action_id for m in memory if not m.model_visible)  # type: ignore[union-attr]
        assert all(count == 1 for count in actions.values())

    def expect_refused(self, command: AgentResumeCommand) -> None:
        before = self.turn
        saves = len(self.store.saved)
        try:
            self.runner.submit_resume(self.turn_id, command)
        except InvalidResumeCommand:
            pass
        else:
            raise AssertionError(f"{command!r} was accepted on {before.status} / {before.suspension!r}")
        assert self.turn == before and len(self.store.saved) == saves

    def submit(self, command: AgentResumeCommand) -> None:
        if command.tool_call_id is not None and command.type.name == "APPROVE_TOOL":
            self.world.approved.add(command.tool_call_id)
        submitted = self.runner.submit_resume(self.turn_id, command)
        assert submitted.version == self.store.saves_of(self.turn_id)[-1].version


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(responses, min_size=1, max_size=8), data=st.data())
def test_random_models_and_resume_commands_keep_every_turn_invariant(
    specs: list[tuple[str, ...]], data: st.DataObject
) -> None:
    h = Harness(specs)
    h.check()
    for _ in range(80):
        turn = h.turn
        if turn.is_terminal:
            break
        if turn.is_runnable(h.clock()):
            action = data.draw(st.sampled_from(["step"] * 30 + ["cancel"]), label="runnable action")
            if action == "cancel":
                h.runner.cancel(h.turn_id)
            else:
                h.runner.step(turn)
            h.check()
            continue
        options = ["valid"] * 5 + ["invalid", "invalid", "duplicate", "cancel"]
        assert turn.suspension is not None
        if turn.suspension.type is SuspensionType.RETRY:
            options.append("wait")
        action = data.draw(st.sampled_from(options), label="blocked action")
        if action == "valid":
            h.submit(_valid_command(turn, data.draw(st.sampled_from(["approve", "reject"]), label="decision")))
        elif action == "invalid":
            h.expect_refused(data.draw(st.sampled_from(_invalid_commands(turn)), label="invalid command"))
        elif action == "duplicate":
            command = _valid_command(turn, "approve")
            h.submit(command)
            h.check()
            h.expect_refused(command)
        elif action == "wait":
            h.clock.advance(3600)
        else:
            assert h.runner.cancel(h.turn_id).is_terminal
        h.check()
    else:
        raise AssertionError("the turn neither ended nor blocked for good within 80 operations")
    # Once ended, nothing changes the turn any more
    ended = h.turn
    assert ended.is_terminal
    for command in (
        AgentResumeCommand.retry(),
        AgentResumeCommand.approve_tool("k1"),
        AgentResumeCommand.user_input("hi"),
    ):
        h.expect_refused(command)
    assert h.runner.step(ended).turn == ended
    assert h.runner.cancel(h.turn_id) == ended
    assert h.turn == ended
    h.check()
