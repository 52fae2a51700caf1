"""`InputLimits` and its checks: boundaries, configuration, and what happens to model output over a limit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentRunner,
    AgentRunnerError,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    ChatResponse,
    InMemoryChatMemoryProvider,
    InputLimitError,
    InputLimits,
    InvalidResumeCommand,
    InvalidTextError,
    ScriptedChatModel,
    ToolCall,
    ToolError,
    ToolMessage,
    machine,
    tool,
)
from agent_runner.forms import validate_form_data
from agent_runner.limits import (
    MAX_JSON_DEPTH,
    MIB,
    bounded_text,
    check_conversation_id,
    check_id,
    check_json,
    check_reference,
    check_tenant_id,
    check_text,
    storable_text,
)
from agent_runner.persistence import AgentTurnStore
from agent_runner.tools import INVALID_ARGUMENTS_KEY
from store import SqlAgentTurnStore

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def nested(depth: int) -> Any:
    """A list `depth` levels deep, built without recursion."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@tool
def echo(value: Any = None) -> str:
    """Echo a value."""
    return "echoed"


# --- The checks --------------------------------------------------------------------------------


def test_ids_at_the_length_limit_pass_and_one_more_character_fails() -> None:
    assert check_id("a" * 128, "conversation_id") == "a" * 128
    assert check_id("A-z_0.9:x", "conversation_id") == "A-z_0.9:x"
    with pytest.raises(InputLimitError) as caught:
        check_id("a" * 129, "conversation_id")
    assert (caught.value.field, caught.value.found) == ("conversation_id", "129 characters")
    assert "128" in caught.value.limit and isinstance(caught.value, AgentRunnerError)


@pytest.mark.parametrize(
    ("value", "found"),
    [("", "an empty string"), ("a b", "' ' at position 1"), ("a/b", "'/' at position 1"), ("ab\x00", "U+0000")],
)
def test_ids_outside_the_character_set_name_the_first_bad_character(value: str, found: str) -> None:
    with pytest.raises(InputLimitError) as caught:
        check_id(value, "tenant_id")
    assert found in caught.value.found


def test_a_conversation_id_follows_the_id_rules_and_a_tenant_the_tenant_rules() -> None:
    assert check_conversation_id("c.1:x") == "c.1:x" and check_conversation_id("c" * 128) == "c" * 128
    assert check_tenant_id("tenant_B-9") == "tenant_B-9"


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ("t/c", "'/' at position 1"),
        ("", "an empty string"),
        ("c" * 129, "129 characters"),
        ("c\x00", "U+0000"),
        (["c"], "a list"),
    ],
)
def test_conversation_ids_outside_the_rules_name_what_breaks_them(value: object, found: str) -> None:
    with pytest.raises(InputLimitError) as caught:
        check_conversation_id(value)
    assert caught.value.field == "conversation_id" and found in caught.value.found


def test_two_tenants_using_one_conversation_id_never_meet() -> None:
    memories = InMemoryChatMemoryProvider()
    runner = AgentRunner(chat_memory_provider=memories)
    agent = Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="ok")] * 3))
    # Given tenant-a holds an active turn in conversation c-1
    held = runner.start(agent, "from a", conversation_id="c-1", tenant_id="tenant-a")
    active = runner.turn_store.find_active_turn("c-1", "tenant-a")
    assert active is not None and active.id == held.id
    # When tenant-b and a caller without a tenant use the same conversation id, they are not busy
    for tenant in ("tenant-b", None):
        done = runner.run(agent, f"from {tenant}", conversation_id="c-1", tenant_id=tenant)
        assert done.status is AgentTurnStatus.COMPLETED and done.conversation_id == "c-1"
        assert runner.turn_store.find_active_turn("c-1", tenant) is None
    # And each conversation's history holds its own messages only
    shown = {
        tenant: [getattr(m, "content", None) for m in memories("c-1", tenant_id=tenant).get_messages(10)]
        for tenant in ("tenant-b", None)
    }
    assert shown == {"tenant-b": ["from tenant-b", "ok"], None: ["from None", "ok"]}
    assert [getattr(m, "content", None) for m in memories("c-1", tenant_id="tenant-a").get_messages(10)] == ["from a"]


def test_references_accept_any_storable_text_of_a_model_provider() -> None:
    assert check_reference("functions.lookup:0 #1", "tool_call_id") == "functions.lookup:0 #1"
    with pytest.raises(InvalidTextError):
        check_reference("call\ud800", "tool_call_id")
    with pytest.raises(InputLimitError):
        check_reference("c" * 129, "tool_call_id")


def test_text_size_counts_utf8_bytes_not_characters() -> None:
    assert check_text("\u00e9" * 5, "message", 10) == "\u00e9" * 5
    with pytest.raises(InputLimitError) as caught:
        check_text("\u00e9" * 6, "message", 10)
    assert caught.value.found == "12 bytes"


@pytest.mark.parametrize(("text", "position", "what"), [("ab\x00", 2, "NUL"), ("\udcff", 0, "U+DCFF")])
def test_unstorable_text_names_the_character_and_its_position(text: str, position: int, what: str) -> None:
    with pytest.raises(InvalidTextError) as caught:
        check_text(text, "content", 100)
    assert caught.value.position == position and caught.value.character == text[position]
    assert what in str(caught.value) and "cannot be stored" in str(caught.value)


def test_json_depth_is_checked_without_recursion() -> None:
    check_json(nested(64), "data", max_bytes=None, max_depth=64)
    with pytest.raises(InputLimitError) as caught:
        check_json(nested(65), "data", max_bytes=None, max_depth=64)
    assert caught.value.limit == "64 levels"
    # 200,000 levels: far beyond what any recursive walk (or json.dumps) survives
    with pytest.raises(InputLimitError):
        check_json(nested(200_000), "data", max_bytes=None, max_depth=64)


def test_json_size_is_the_compact_utf8_encoding() -> None:
    value = {"k": "\u00e9" * 10}  # {"k":"...."} = 8 + 20 bytes
    assert check_json(value, "data", max_bytes=28, max_depth=4) == 28
    with pytest.raises(InputLimitError) as caught:
        check_json(value, "data", max_bytes=27, max_depth=4)
    assert caught.value.found == "28 bytes"


@pytest.mark.parametrize(
    "value",
    [{"k": float("nan")}, {"k": 2**5000}, {3: "x"}, {"k": {1}}, {"k": b"x"}, {"k": NOW}],
    ids=["nan", "huge-int", "int-key", "set", "bytes", "datetime"],
)
def test_only_json_values_pass(value: Any) -> None:
    with pytest.raises(InputLimitError):
        check_json(value, "metadata", max_bytes=10_000, max_depth=8)


def test_storable_text_and_bounded_text() -> None:
    assert storable_text("a\x00b\ud800c") == "a\ufffdb\ufffdc"
    assert bounded_text("short", 100) == "short"
    cut = bounded_text("\u00e9" * 1000, 200)
    assert len(cut.encode("utf-8")) <= 200 and cut.endswith("over the limit of 200 bytes]")


# --- Configuration -----------------------------------------------------------------------------


def test_limits_have_safe_defaults_and_refuse_unusable_values() -> None:
    limits = AgentExecutionPolicy().limits
    assert limits == InputLimits()
    assert (limits.max_json_depth, limits.max_id_length) == (64, 128)
    assert (limits.max_form_data_bytes, limits.max_tool_arguments_bytes, limits.max_message_bytes) == (
        256 * 1024,
        256 * 1024,
        MIB,
    )
    for bad in ({"max_json_depth": 0}, {"max_json_depth": MAX_JSON_DEPTH + 1}, {"max_message_bytes": 0}):
        with pytest.raises(ValidationError):
            InputLimits(**bad)


def test_a_policy_with_lower_limits_refuses_what_the_defaults_accept() -> None:
    strict = AgentRunner(
        chat_memory_provider=InMemoryChatMemoryProvider(),
        policy=AgentExecutionPolicy(limits=InputLimits(max_message_bytes=10, max_id_length=4)),
    )
    agent = Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="ok")] * 3))
    assert strict.run(agent, "0123456789", conversation_id="c-12").status is AgentTurnStatus.COMPLETED
    with pytest.raises(InputLimitError, match="message"):
        strict.run(agent, "01234567890")
    with pytest.raises(InputLimitError, match="conversation_id"):
        strict.run(agent, "hi", conversation_id="c-123")
    lenient = AgentRunner(chat_memory_provider=InMemoryChatMemoryProvider())
    assert lenient.run(agent, "01234567890", conversation_id="c-123").status is AgentTurnStatus.COMPLETED


def test_a_policy_with_higher_limits_accepts_bigger_tool_arguments() -> None:
    big = {"value": "x" * (300 * 1024)}
    for limits, refused in ((InputLimits(), True), (InputLimits(max_tool_arguments_bytes=MIB), False)):
        model = ScriptedChatModel(
            [AiMessage(tool_calls=[ToolCall(id="c1", name="echo", arguments=big)]), AiMessage(content="ok")]
        )
        runner = AgentRunner(policy=AgentExecutionPolicy(limits=limits))
        turn = runner.run(Agent(id="a", chat_model=model, tools=[echo]), "go")
        answer = next(m for m in turn.messages if isinstance(m, ToolMessage))
        assert answer.is_error is refused
        assert ("262144 bytes" in answer.content) is refused


# --- Form data -----------------------------------------------------------------------------------

RECURSIVE_FORM = AgentFormDefinition(
    key="tree", schema={"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}}
)


def test_form_validation_reports_deep_data_instead_of_recursing() -> None:
    assert validate_form_data(RECURSIVE_FORM.schema, nested(10)) == []
    [error] = validate_form_data(RECURSIVE_FORM.schema, nested(100_000))
    assert "64 levels" in error


def test_a_deep_form_submission_is_refused_and_the_turn_still_waits() -> None:
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="f1", name="request_user_input", arguments={"formKey": "tree"})]),
            AiMessage(content="ok"),
        ]
    )
    runner = AgentRunner()
    waiting = runner.run(Agent(id="a", chat_model=model, tools=[AgentUserInputTool(forms=[RECURSIVE_FORM])]), "go")
    with pytest.raises(InputLimitError):
        runner.resume(waiting.id, AgentResumeCommand.user_input("f1", {"tree": nested(10_000)}))
    with pytest.raises(InvalidResumeCommand):  # within the limits, but not what the schema asks for
        runner.resume(waiting.id, AgentResumeCommand.user_input("f1", {"tree": nested(3)}))
    assert runner.turn_store.load(waiting.id).version == waiting.version


# --- Model output ------------------------------------------------------------------------------


def _turn() -> AgentTurn:
    return AgentTurn(id="t1", agent_id="a", agent_version="1", root_turn_id="t1", created_at=NOW, updated_at=NOW)


def test_model_output_is_made_storable_without_limits() -> None:
    message = AiMessage(
        content="hi\x00",
        tool_calls=[
            ToolCall(id="c\ud800", name="echo", arguments={"value": "ok"}),
            ToolCall(id="c2", name="echo", arguments={"value": nested(200)}),
        ],
    )
    _, recorded = machine.apply_model_response(_turn(), ChatResponse(message=message), NOW)
    assert recorded.content == "hi\ufffd"
    assert recorded.tool_calls[0].id == "c\ufffd" and recorded.tool_calls[0].arguments == {"value": "ok"}
    marker = recorded.tool_calls[1].arguments[INVALID_ARGUMENTS_KEY]
    assert f"{MAX_JSON_DEPTH} levels" in marker["error"]


def test_model_output_over_the_limits_is_bounded_when_limits_are_given() -> None:
    limits = InputLimits(max_tool_arguments_bytes=100, max_message_bytes=200)
    message = AiMessage(
        content="x" * 1000, tool_calls=[ToolCall(id="c1", name="echo", arguments={"value": "y" * 10_000})]
    )
    _, recorded = machine.apply_model_response(_turn(), ChatResponse(message=message), NOW, limits)
    assert recorded.content is not None and len(recorded.content.encode()) <= 200
    marker = recorded.tool_calls[0].arguments[INVALID_ARGUMENTS_KEY]
    assert "100 bytes" in marker["error"] and len(marker["raw"]) < 300
    # Without limits the same message is kept whole (the policy's limits apply before the call runs)
    _, kept = machine.apply_model_response(_turn(), ChatResponse(message=message), NOW)
    assert kept.content == "x" * 1000 and kept.tool_calls[0].arguments == {"value": "y" * 10_000}


def test_a_message_that_is_already_storable_is_returned_as_it_is() -> None:
    message = AiMessage(content="fine", tool_calls=[ToolCall(id="c1", name="echo", arguments={"value": [1, 2]})])
    assert machine.storable_message(message) is message


STORABLE_TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | STORABLE_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(STORABLE_TEXT, children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_the_size_limit_is_exact_for_any_json_value(value: Any) -> None:
    # The walk stops early on a lower bound of the size; it must never refuse a value that fits.
    size = check_json(value, "data", max_bytes=10**9, max_depth=MAX_JSON_DEPTH)
    assert size is not None
    assert check_json(value, "data", max_bytes=size, max_depth=MAX_JSON_DEPTH) == size
    with pytest.raises(InputLimitError):
        check_json(value, "data", max_bytes=size - 1, max_depth=MAX_JSON_DEPTH)


def test_a_huge_flat_value_is_refused_early() -> None:
    with pytest.raises(InputLimitError) as caught:
        check_json([{"k": 1}] * 1_000_000, "form data", max_bytes=256 * 1024, max_depth=64)
    assert caught.value.found == "more than 262144 bytes"
    with pytest.raises(InputLimitError):
        check_json({str(i): i for i in range(100_000)}, "metadata", max_bytes=64 * 1024, max_depth=64)


# --- Tool output ---------------------------------------------------------------------------------


@tool
def dump(kind: str) -> Any:
    """Return what a careless tool might."""
    if kind == "huge":
        return "y" * (3 * 1024)
    if kind == "unstorable":
        return {"text": "a\x00b\udc80c"}
    raise ToolError("failed: \udc80" + "z" * 5000)


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_tool_output_is_made_storable_and_cut_at_the_message_limit(store_kind: str, tmp_path: Path) -> None:
    calls = [
        ToolCall(id=f"c{n}", name="dump", arguments={"kind": k}) for n, k in enumerate(("huge", "unstorable", "err"))
    ]
    model = ScriptedChatModel([AiMessage(tool_calls=[call]) for call in calls] + [AiMessage(content="done")])
    store: AgentTurnStore | None = None
    if store_kind == "sqlite":
        store = SqlAgentTurnStore(f"sqlite:///{tmp_path / 'turns.db'}")
    runner = AgentRunner(turn_store=store, policy=AgentExecutionPolicy(limits=InputLimits(max_message_bytes=1024)))
    # When tools return text over the limit, text no store can keep, and raise with both
    turn = runner.run(Agent(id="a", chat_model=model, tools=[dump]), "go")
    # Then each answer was saved (the tool did not run again) and the turn went on to its end
    assert turn.status is AgentTurnStatus.COMPLETED
    huge, unstorable, failed = (m for m in runner.turn_store.load(turn.id).messages if isinstance(m, ToolMessage))
    assert len(huge.content.encode()) <= 1024 and "3072 bytes, over the limit of 1024 bytes" in huge.content
    # (JSON escapes the NUL character; the lone surrogate becomes U+FFFD)
    assert unstorable.content == '{"text": "a\\u0000b\ufffdc"}' and not unstorable.is_error
    assert failed.is_error and failed.content.startswith("failed: \ufffd") and len(failed.content.encode()) <= 1024


def test_a_cancel_reason_over_the_limit_is_refused_and_the_turn_goes_on() -> None:
    runner = AgentRunner(policy=AgentExecutionPolicy(limits=InputLimits(max_message_bytes=16)))
    turn = runner.start(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="ok")])), "go")
    with pytest.raises(InputLimitError, match="reason"):
        runner.cancel(turn.id, "because " * 3)
    with pytest.raises(InvalidTextError):
        runner.cancel(turn.id, "bad \x00")
    assert runner.turn_store.load(turn.id) == turn
    assert runner.cancel(turn.id, "user left").status is AgentTurnStatus.CANCELLED


@pytest.mark.parametrize("bad_id", ["t\x00", "t\ud800", "t" * 129, ""])
def test_runner_entry_points_taking_a_turn_id_refuse_one_that_is_not_an_id(bad_id: str) -> None:
    runner = AgentRunner()
    calls: list[Callable[[], object]] = [
        lambda: runner.restore(bad_id),
        lambda: runner.cancel(bad_id),
        lambda: runner.cancel(bad_id, reason="why"),
        lambda: runner.resume(bad_id, AgentResumeCommand.retry()),
        lambda: runner.submit_resume(bad_id, AgentResumeCommand.retry()),
    ]
    for call in calls:
        with pytest.raises(InputLimitError, match="turn_id"):
            call()
