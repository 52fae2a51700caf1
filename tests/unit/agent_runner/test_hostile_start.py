"""Hostile input to `AgentRunner.run` and `start`: refused with a typed error before anything is saved.

Every refused input ends in a typed error (a subclass of `AgentRunnerError`) and a digest of
every table (and of the test's Redis keys) taken before and after shows that nothing was
written. The cases run on SQLite (embedded mode) and on PostgreSQL with the Redis
conversation guard (distributed mode).
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from agent_runner import (
    AgentRunnerError,
    AgentTurnStatus,
    AiMessage,
    InputLimitError,
    InvalidTextError,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runner.limits import KIB, MIB
from tests.helpers.hostile import NON_UTF8, SQL_INJECTION, Deployment, assert_refused, hostile_agent, nested

START_CASES: list[Any] = [
    # the message
    pytest.param({"message": "a\x00b"}, InvalidTextError, "message", id="message-nul"),
    pytest.param({"message": "a\ud800b"}, InvalidTextError, "message", id="message-lone-surrogate"),
    pytest.param({"message": NON_UTF8}, InvalidTextError, "message", id="message-non-utf8"),
    pytest.param({"message": "x" * (MIB + 1)}, InputLimitError, "message", id="message-over-1MiB"),
    pytest.param({"message": "\U0001f600" * (3 * MIB)}, InputLimitError, "message", id="message-12MB-emoji"),
    pytest.param({"message": UserMessage(id="m\x00", content="hi")}, InvalidTextError, "message.id", id="msg-id-nul"),
    pytest.param(
        {"message": UserMessage(id="m" * 1_000_000, content="hi")}, InputLimitError, "message.id", id="msg-id-1MB"
    ),
    # the conversation id
    pytest.param({"conversation_id": ""}, InputLimitError, "conversation_id", id="conversation-empty"),
    pytest.param({"conversation_id": " "}, InputLimitError, "conversation_id", id="conversation-space"),
    pytest.param({"conversation_id": "c\x00"}, InputLimitError, "conversation_id", id="conversation-nul"),
    pytest.param({"conversation_id": "c\ud800"}, InputLimitError, "conversation_id", id="conversation-surrogate"),
    pytest.param({"conversation_id": "c" * 129}, InputLimitError, "conversation_id", id="conversation-129"),
    pytest.param({"conversation_id": "c" * 1_000_000}, InputLimitError, "conversation_id", id="conversation-1MB"),
    pytest.param({"conversation_id": SQL_INJECTION}, InputLimitError, "conversation_id", id="conversation-sql"),
    pytest.param({"conversation_id": "c-1\n"}, InputLimitError, "conversation_id", id="conversation-newline"),
    pytest.param({"conversation_id": "../../etc"}, InputLimitError, "conversation_id", id="conversation-path"),
    pytest.param({"conversation_id": "c%00"}, InputLimitError, "conversation_id", id="conversation-percent"),
    pytest.param({"conversation_id": 5}, InputLimitError, "conversation_id", id="conversation-int"),
    pytest.param({"conversation_id": ["c-1"]}, InputLimitError, "conversation_id", id="conversation-list"),
    # the tenant id
    pytest.param({"tenant_id": ""}, InputLimitError, "tenant_id", id="tenant-empty"),
    pytest.param({"tenant_id": "t" * 129}, InputLimitError, "tenant_id", id="tenant-129"),
    pytest.param({"tenant_id": "t\x00"}, InputLimitError, "tenant_id", id="tenant-nul"),
    pytest.param({"tenant_id": SQL_INJECTION}, InputLimitError, "tenant_id", id="tenant-sql"),
    pytest.param({"tenant_id": 7}, InputLimitError, "tenant_id", id="tenant-int"),
    # the metadata
    pytest.param({"metadata": [1, 2]}, InputLimitError, "metadata", id="metadata-list"),
    pytest.param({"metadata": "x"}, InputLimitError, "metadata", id="metadata-str"),
    pytest.param({"metadata": {"k": {1, 2}}}, InputLimitError, "metadata", id="metadata-set"),
    pytest.param({"metadata": {"k": b"raw"}}, InputLimitError, "metadata", id="metadata-bytes"),
    pytest.param({"metadata": {"k": object()}}, InputLimitError, "metadata", id="metadata-object"),
    pytest.param({"metadata": {"k": float("nan")}}, InputLimitError, "metadata", id="metadata-nan"),
    pytest.param({"metadata": {"k": float("-inf")}}, InputLimitError, "metadata", id="metadata-inf"),
    pytest.param({"metadata": {"k": 10**5000}}, InputLimitError, "metadata", id="metadata-huge-int"),
    pytest.param({"metadata": {1: "x"}}, InputLimitError, "metadata", id="metadata-int-key"),
    pytest.param({"metadata": {"k": "a\x00"}}, InvalidTextError, "metadata", id="metadata-nul"),
    pytest.param({"metadata": {"k\ud800": 1}}, InvalidTextError, "a key of metadata", id="metadata-surrogate-key"),
    pytest.param({"metadata": nested(65)}, InputLimitError, "metadata", id="metadata-65-deep"),
    pytest.param({"metadata": nested(10_000)}, InputLimitError, "metadata", id="metadata-10000-deep"),
    pytest.param({"metadata": {"k": "x" * (64 * KIB)}}, InputLimitError, "metadata", id="metadata-over-64KiB"),
    pytest.param({"metadata": {"k": "x" * 10_000_000}}, InputLimitError, "metadata", id="metadata-10MB"),
    # explicit history
    pytest.param({"history": [UserMessage(content="a\x00")]}, InvalidTextError, "history[0]", id="history-nul"),
    pytest.param({"history": [UserMessage(content="x" * (MIB + 1))]}, InputLimitError, "history[0]", id="history-big"),
    pytest.param(
        {"history": [AiMessage(tool_calls=[ToolCall(id="c", name="inspect_data", arguments=nested(10_000))])]},
        InputLimitError,
        "history[0].tool_calls[0].arguments",
        id="history-deep-arguments",
    ),
    pytest.param(
        {"history": [ToolMessage(tool_call_id="c" * 10_000, tool_name="inspect_data", content="x")]},
        InputLimitError,
        "history[0].tool_call_id",
        id="history-long-call-id",
    ),
]


def refuse_start(
    deployment: Deployment, entry: str, arguments: dict[str, Any], error: type[AgentRunnerError], field: str
) -> None:
    """`run` or `start` with these arguments raises `error` about `field` and writes nothing."""
    arguments = {"message": "hello", **arguments}
    message = arguments.pop("message")
    if "history" not in arguments and "conversation_id" not in arguments:
        arguments["conversation_id"] = "c-new"  # the guard path, in the distributed deployment
    start = getattr(deployment.runner, entry)
    assert_refused(deployment, lambda: start(hostile_agent(), message, **arguments), error, field)


@pytest.mark.parametrize("entry", ["start", "run"])
@pytest.mark.parametrize(("arguments", "error", "field"), START_CASES)
def test_hostile_start_input_is_refused_before_anything_is_saved(
    refusing: Deployment, entry: str, arguments: dict[str, Any], error: type[AgentRunnerError], field: str
) -> None:
    refuse_start(refusing, entry, arguments, error, field)


@pytest.mark.integration
def test_hostile_start_input_changes_nothing_on_postgresql_with_the_redis_guard(pg_deployment: Deployment) -> None:
    # The same cases, one after the other on one distributed deployment (a schema per case would be slow).
    for case in START_CASES:
        arguments, error, field = case.values
        for entry in ("start", "run"):
            refuse_start(pg_deployment, entry, arguments, error, field)


def test_nasty_but_valid_input_is_stored_exactly(any_deployment: Deployment) -> None:
    # Given text and ids full of SQL metacharacters, quotes, emoji and direction marks, at the limits
    message = f"{SQL_INJECTION} \" \\ ' \U0001f600 \u202eabc \u05e2\u05d1\u05e8\u05d9\u05ea \t\n%s %(x)s"
    conversation = "a.B:c-9_" + "z" * 120
    metadata = {"quote\"'": SQL_INJECTION, "deep": nested(63), "emoji": "\U0001f600"}
    assert len(conversation) == 128
    tables = set(sa.inspect(any_deployment.engine).get_table_names())
    assert "agent_turns" in tables

    # When a turn is run with them
    turn = any_deployment.runner.run(
        hostile_agent(), message, conversation_id=conversation, metadata=metadata, tenant_id="t.1"
    )

    # Then they come back byte for byte, and every table is still there
    stored = any_deployment.runner.turn_store.load(turn.id)
    assert stored.status is AgentTurnStatus.COMPLETED
    assert stored.messages[0].content == message
    assert stored.conversation_id == conversation and stored.tenant_id == "t.1"
    assert stored.metadata == metadata
    assert any_deployment.runner.chat_memory_provider is not None
    memory = any_deployment.runner.chat_memory_provider(conversation, tenant_id="t.1")
    assert memory.get_messages(10)[0].content == message  # type: ignore[union-attr]
    assert set(sa.inspect(any_deployment.engine).get_table_names()) == tables


def test_a_message_of_exactly_1_mib_is_accepted(any_deployment: Deployment) -> None:
    message = "\u00e9" * (MIB // 2)  # two bytes each in UTF-8
    turn = any_deployment.runner.start(hostile_agent(), message)
    assert any_deployment.runner.turn_store.load(turn.id).messages[-1].content == message
