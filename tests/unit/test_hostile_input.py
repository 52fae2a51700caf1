"""Hostile input against the Python API, the command line and the Celery entry points.

Every refused input ends in a typed error (a subclass of `AgentRunnerError`) or one clear
`error:` line from the CLI, and a digest of every table (and of the test's Redis keys)
taken before and after shows that nothing was written. The SQL cases run on SQLite
(embedded mode) and on PostgreSQL with the Redis conversation guard (distributed mode).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from redis import Redis

import store
from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentRunner,
    AgentRunnerError,
    AgentSuspension,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    InputLimitError,
    InvalidTextError,
    ScriptedChatModel,
    StoreError,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)
from agent_runner.limits import KIB, MIB
from agent_runner.models.openai import parse_tool_arguments
from agent_runner.tools import INVALID_ARGUMENTS_KEY
from workers.cli import main as cli_main
from workers.settings import SettingsError, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
TEST_REDIS_URL = os.environ.get("AGENT_RUNNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
SQL_INJECTION = "x'; DROP TABLE agent_turns; --"
NON_UTF8 = b"caf\xe9".decode("utf-8", "surrogateescape")
"""What Python makes of a Latin-1 command-line argument on a UTF-8 system: a lone surrogate."""

FORM = AgentFormDefinition(
    key="details",
    description="ticket details",
    schema={"type": "object", "properties": {"system": {"type": "string"}}, "additionalProperties": {"$ref": "#"}},
)


@tool(requires_approval=True)
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


@tool
def inspect_data(data: Any = None) -> str:
    """Look at any JSON value."""
    return "looked"


def nested(depth: int, leaf: Any = 1) -> dict[str, Any]:
    """A dict `depth` levels deep (built without recursion)."""
    root: dict[str, Any] = {}
    current = root
    for _ in range(depth - 1):
        current["a"] = {}
        current = current["a"]
    current["a"] = leaf
    return root


def _reply(request: ChatRequest) -> AiMessage:
    last = request.messages[-1]
    if isinstance(last, UserMessage) and last.content == "fill in the form":
        return AiMessage(
            tool_calls=[ToolCall(id="call-form", name="request_user_input", arguments={"formKey": "details"})]
        )
    if isinstance(last, UserMessage) and last.content == "deploy the api":
        return AiMessage(tool_calls=[ToolCall(id="call-deploy", name="deploy", arguments={"service": "api"})])
    return AiMessage(content="done")


def _agent() -> Agent:
    return Agent(
        id="ops", chat_model=ScriptedChatModel(_reply), tools=[deploy, inspect_data, AgentUserInputTool(forms=[FORM])]
    )


# --- Deployments and digests ---------------------------------------------------------------------


@dataclass
class Deployment:
    """A runner on a real SQL store (and, on PostgreSQL, the Redis guard) with three waiting turns."""

    url: str
    runner: AgentRunner
    engine: sa.Engine
    redis: Redis[bytes] | None
    prefix: str
    form_turn: AgentTurn
    approval_turn: AgentTurn
    question_turn: AgentTurn
    _tables: sa.MetaData | None = None

    def tables(self) -> sa.MetaData:
        """Every table of the database (reflected once: the schema never changes during a test)."""
        if self._tables is None:
            self._tables = sa.MetaData()
            self._tables.reflect(self.engine)
        return self._tables

    def digest(self) -> str:
        """A hash of every row of every table, and of every Redis key of this test."""
        hasher = hashlib.sha256()
        metadata = self.tables()
        with self.engine.connect() as connection:
            for name in sorted(metadata.tables):
                rows = sorted(repr(tuple(row)) for row in connection.execute(sa.select(metadata.tables[name])))
                hasher.update(f"{name}:{len(rows)}:{rows}".encode())
        if self.redis is not None:
            for key in sorted(self.redis.scan_iter(f"{self.prefix}*")):
                hasher.update(key + b"=" + (self.redis.dump(key) or b""))
        return hasher.hexdigest()

    def stored_bytes(self) -> int:
        """Total length of every stored value, to see how often a big value was copied."""
        metadata = self.tables()
        total = 0
        with self.engine.connect() as connection:
            for table in metadata.tables.values():
                for row in connection.execute(sa.select(table)):
                    total += sum(len(str(value)) for value in row)
        return total


@contextmanager
def deployed(url: str, redis: Redis[bytes] | None = None) -> Iterator[Deployment]:
    """A runner on `url` (with the Redis guard when `redis` is given) and its three waiting turns."""
    prefix = f"agent-runner-hostile-{uuid.uuid4().hex}"
    guard = None if redis is None else store.RedisConversationGuard(TEST_REDIS_URL, prefix=prefix)
    turn_store = store.SqlAgentTurnStore(url)
    memory = store.SqlChatMemoryProvider(url)
    engine = sa.create_engine(url)
    try:
        runner = AgentRunner(turn_store=turn_store, chat_memory_provider=memory, conversation_guard=guard)
        form_turn = runner.run(_agent(), "fill in the form", conversation_id="c-form", tenant_id="tenant-a")
        approval_turn = runner.run(_agent(), "deploy the api", conversation_id="c-approval")
        question_turn = runner.suspend(runner.start(_agent(), "ask me"), AgentSuspension.user_input("which order?"))
        assert form_turn.status is AgentTurnStatus.WAITING_FOR_USER
        assert approval_turn.status is AgentTurnStatus.WAITING_FOR_APPROVAL
        assert question_turn.status is AgentTurnStatus.WAITING_FOR_USER
        yield Deployment(url, runner, engine, redis, prefix, form_turn, approval_turn, question_turn)
    finally:
        turn_store.close()
        memory.close()
        engine.dispose()
        if redis is not None:
            for key in redis.scan_iter(f"{prefix}*"):
                redis.delete(key)


@pytest.fixture
def redis_client() -> Iterator[Redis[bytes]]:
    client: Redis[bytes] = Redis.from_url(TEST_REDIS_URL, socket_timeout=5)
    try:
        client.ping()  # an unreachable server fails the test
        yield client
    finally:
        client.close()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Embedded mode: SQLite, no Redis."""
    with deployed(f"sqlite:///{tmp_path / 'hostile.db'}") as embedded:
        yield embedded


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One embedded deployment shared by the refusal cases: each checks that it changed nothing."""
    with deployed(f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'hostile.db'}") as embedded:
        yield embedded


@pytest.fixture
def pg_deployment(pg_url: str, redis_client: Redis[bytes]) -> Iterator[Deployment]:
    """Distributed mode: PostgreSQL and the Redis conversation guard."""
    with deployed(pg_url, redis_client) as distributed:
        yield distributed


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def any_deployment(request: pytest.FixtureRequest) -> Deployment:
    """Both modes, for the cases that are not run one by one on PostgreSQL."""
    fixture = "deployment" if request.param == "sqlite" else "pg_deployment"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]


def assert_refused(
    deployment: Deployment, action: Callable[[], object], error: type[AgentRunnerError], field: str | None = None
) -> AgentRunnerError:
    """Run `action`, expect `error`, and check that not a single row or key changed."""
    before = deployment.digest()
    with pytest.raises(error) as caught:
        action()
    assert deployment.digest() == before, "a refused input changed the stored state"
    if field is not None:
        assert isinstance(caught.value, InputLimitError)
        assert caught.value.field.startswith(field), caught.value.field
    return caught.value


# --- AgentRunner.run and start -------------------------------------------------------------------

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
    assert_refused(deployment, lambda: start(_agent(), message, **arguments), error, field)


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
        _agent(), message, conversation_id=conversation, metadata=metadata, tenant_id="t.1"
    )

    # Then they come back byte for byte, and every table is still there
    stored = any_deployment.runner.turn_store.load(turn.id)
    assert stored.status is AgentTurnStatus.COMPLETED
    assert stored.messages[0].content == message
    assert stored.conversation_id == conversation and stored.tenant_id == "t.1"
    assert stored.metadata == metadata
    assert any_deployment.runner.chat_memory_provider is not None
    assert any_deployment.runner.chat_memory_provider(conversation).get_messages(10)[0].content == message  # type: ignore[union-attr]
    assert set(sa.inspect(any_deployment.engine).get_table_names()) == tables


def test_a_message_of_exactly_1_mib_is_accepted(any_deployment: Deployment) -> None:
    message = "\u00e9" * (MIB // 2)  # two bytes each in UTF-8
    turn = any_deployment.runner.start(_agent(), message)
    assert any_deployment.runner.turn_store.load(turn.id).messages[-1].content == message


# --- Resume commands -------------------------------------------------------------------------------


def _form(data: Any) -> AgentResumeCommand:
    return AgentResumeCommand.user_input("call-form", data)


RESUME_CASES: list[Any] = [
    # form data
    pytest.param("form", _form(nested(10_000)), InputLimitError, "form data", id="form-10000-deep"),
    pytest.param("form", _form(nested(65)), InputLimitError, "form data", id="form-65-deep"),
    pytest.param("form", _form({"system": "x" * (256 * KIB)}), InputLimitError, "form data", id="form-over-256KiB"),
    pytest.param("form", _form({"system": "x" * 10_000_000}), InputLimitError, "form data", id="form-10MB"),
    pytest.param("form", _form({"system": "a\ud800"}), InvalidTextError, "form data at /system", id="form-surrogate"),
    pytest.param("form", _form({"system": NON_UTF8}), InvalidTextError, "form data", id="form-non-utf8"),
    pytest.param("form", _form({"sys\x00tem": "x"}), InvalidTextError, "a key of form data", id="form-nul-key"),
    pytest.param("form", _form({"system": float("nan")}), InputLimitError, "form data", id="form-nan"),
    pytest.param("form", _form({"system": {1, 2}}), InputLimitError, "form data", id="form-set"),
    pytest.param("form", _form({"n": 10**5000}), InputLimitError, "form data", id="form-huge-int"),
    pytest.param(
        "form", AgentResumeCommand.user_input("c" * 1_000_000, {}), InputLimitError, "tool_call_id", id="call-id-1MB"
    ),
    pytest.param("form", AgentResumeCommand.user_input("c\x00", {}), InvalidTextError, "tool_call_id", id="call-nul"),
    pytest.param("form", AgentResumeCommand.user_input("", {}), InputLimitError, "tool_call_id", id="call-id-empty"),
    # plain-text answers
    pytest.param("question", AgentResumeCommand.user_input("a\x00"), InvalidTextError, "content", id="text-nul"),
    pytest.param("question", AgentResumeCommand.user_input(NON_UTF8), InvalidTextError, "content", id="text-non-utf8"),
    pytest.param(
        "question", AgentResumeCommand.user_input("x" * (MIB + 1)), InputLimitError, "content", id="text-over-1MiB"
    ),
    # decisions
    pytest.param(
        "approval",
        AgentResumeCommand.reject_tool("call-deploy", "x" * (MIB + 1)),
        InputLimitError,
        "reason",
        id="reason-over-1MiB",
    ),
    pytest.param(
        "approval", AgentResumeCommand.reject_tool("call-deploy", "no\x00"), InvalidTextError, "reason", id="reason-nul"
    ),
    pytest.param(
        "approval",
        AgentResumeCommand.approve_tool("call-deploy").with_metadata("k", nested(10_000)),
        InputLimitError,
        "resume metadata",
        id="metadata-deep",
    ),
    pytest.param(
        "approval",
        AgentResumeCommand.approve_tool("call-deploy").with_metadata("k", "x" * (64 * KIB)),
        InputLimitError,
        "resume metadata",
        id="metadata-big",
    ),
    pytest.param(
        "approval",
        AgentResumeCommand.approve_tool("call-deploy").with_metadata("approverId", NON_UTF8),
        InvalidTextError,
        "resume metadata at /approverId",
        id="metadata-non-utf8",
    ),
    pytest.param(
        "approval", AgentResumeCommand.child_completed("c\x00"), InputLimitError, "child_turn_id", id="child-nul"
    ),
]


@pytest.mark.parametrize("entry", ["submit_resume", "resume"])
@pytest.mark.parametrize(("target", "command", "error", "field"), RESUME_CASES)
def test_hostile_resume_commands_are_refused_before_anything_is_saved(
    refusing: Deployment,
    entry: str,
    target: str,
    command: AgentResumeCommand,
    error: type[AgentRunnerError],
    field: str,
) -> None:
    refuse_resume(refusing, entry, target, command, error, field)


def refuse_resume(
    deployment: Deployment,
    entry: str,
    target: str,
    command: AgentResumeCommand,
    error: type[AgentRunnerError],
    field: str,
) -> None:
    """`resume` or `submit_resume` of the `target` turn with `command` raises `error` and writes nothing."""
    turn = {"form": deployment.form_turn, "question": deployment.question_turn, "approval": deployment.approval_turn}
    resume = getattr(deployment.runner, entry)
    assert_refused(deployment, lambda: resume(turn[target].id, command), error, field)


def refuse_turn_id(deployment: Deployment, turn_id: Any) -> None:
    command = AgentResumeCommand.approve_tool("call-deploy")
    assert_refused(deployment, lambda: deployment.runner.submit_resume(turn_id, command), InputLimitError, "turn_id")


HOSTILE_TURN_IDS: list[Any] = ["", "t\x00", "t\ud800", NON_UTF8, "t" * 1_000_000, SQL_INJECTION, "t t", 42]


@pytest.mark.parametrize(
    "turn_id", HOSTILE_TURN_IDS, ids=["empty", "nul", "surrogate", "non-utf8", "1MB", "sql", "space", "int"]
)
def test_hostile_turn_ids_are_refused_by_resume(refusing: Deployment, turn_id: Any) -> None:
    refuse_turn_id(refusing, turn_id)


@pytest.mark.integration
def test_hostile_resume_input_changes_nothing_on_postgresql_with_the_redis_guard(pg_deployment: Deployment) -> None:
    for case in RESUME_CASES:
        target, command, error, field = case.values
        for entry in ("submit_resume", "resume"):
            refuse_resume(pg_deployment, entry, target, command, error, field)
    for turn_id in HOSTILE_TURN_IDS:
        refuse_turn_id(pg_deployment, turn_id)


def test_valid_form_data_with_metacharacters_is_accepted(any_deployment: Deployment) -> None:
    data = {"system": SQL_INJECTION + " \U0001f600", "nested": nested(60, {})}
    turn = any_deployment.runner.resume(any_deployment.form_turn.id, _form(data))
    assert turn.status is AgentTurnStatus.COMPLETED
    tool_message = next(m for m in turn.messages if isinstance(m, ToolMessage))
    assert json.loads(tool_message.content) == data


# --- Model output ----------------------------------------------------------------------------------


def test_a_10mb_argument_for_an_approval_tool_is_answered_with_an_error_not_suspended(
    any_deployment: Deployment,
) -> None:
    # Given a model that asks to deploy with a 10 MB argument, then answers once more
    size = 10_000_000
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="big", name="deploy", arguments={"service": "x" * size})]),
            AiMessage(content="sorry"),
        ]
    )
    agent = Agent(id="ops", chat_model=model, tools=[deploy])
    before = any_deployment.stored_bytes()

    # When the turn runs
    turn = any_deployment.runner.run(agent, "deploy", conversation_id="c-big")

    # Then nobody is asked to approve it: the model is told the limit and the turn goes on
    assert turn.status is AgentTurnStatus.COMPLETED
    answer = next(m for m in turn.messages if isinstance(m, ToolMessage))
    assert answer.is_error and "262144 bytes" in answer.content and "not run" in answer.content
    assert turn.page_actions == [] and turn.suspension is None
    # And the value is stored once in the turn and once in the conversation, not in cards and suspensions
    assert any_deployment.stored_bytes() - before < 2.2 * size


@pytest.mark.parametrize(
    "arguments",
    [nested(65), nested(100_000), {"service": "a\ud800"}, {"serv\x00ice": "api"}, {"service": float("nan")}],
    ids=["65-deep", "100000-deep", "surrogate", "nul-key", "nan"],
)
def test_unusable_model_arguments_become_an_error_tool_message(any_deployment: Deployment, arguments: Any) -> None:
    model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="bad", name="deploy", arguments=arguments)]), AiMessage(content="ok")]
    )
    turn = any_deployment.runner.run(Agent(id="ops", chat_model=model, tools=[deploy]), "deploy")
    assert turn.status is AgentTurnStatus.COMPLETED
    answer = next(m for m in turn.messages if isinstance(m, ToolMessage))
    assert answer.is_error and "not run" in answer.content
    assert turn.suspension is None and turn.page_actions == []
    # The model was asked again with a history it can read
    assert model.calls == 2


def test_unstorable_model_text_is_stored_with_replacement_characters(any_deployment: Deployment) -> None:
    model = ScriptedChatModel([AiMessage(content="ok \ud800 and \x00 done")])
    turn = any_deployment.runner.run(Agent(id="ops", chat_model=model), "hi", conversation_id="c-text")
    stored = any_deployment.runner.turn_store.load(turn.id)
    assert stored.final_output == "ok \ufffd and \ufffd done"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[" * 1_000 + "]" * 1_000, "nested"),
        ("[" * 100_000, "nested"),
        ('{"a":' * 65 + "1" + "}" * 65, "64 levels"),
        ('{"a": NaN}', "NaN is not a JSON value"),
        ('{"a": Infinity}', "Infinity is not a JSON value"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ('{"a": "\\u0000"}', "NUL character"),
        ('{"a": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"a": "' + "x" * (256 * KIB) + '"}', "over the limit of 262144 bytes"),
    ],
    ids=["1000-deep", "100000-open", "65-deep", "nan", "infinity", "surrogate", "nul", "5000-digits", "over-256KiB"],
)
def test_parse_tool_arguments_never_raises(text: str, error: str) -> None:
    parsed = parse_tool_arguments(text)
    assert list(parsed) == [INVALID_ARGUMENTS_KEY]
    assert error in parsed[INVALID_ARGUMENTS_KEY]["error"]
    assert len(parsed[INVALID_ARGUMENTS_KEY]["raw"]) <= 256 * KIB + 16
    json.dumps(parsed).encode("utf-8")  # storable as it is


# --- The command line ------------------------------------------------------------------------------


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(url: str, *args: str) -> CliResult:
    """Run the command line in this process, as the `agent-runner` script runs it."""
    result = CliRunner().invoke(cli_main, ["--database-url", url, *args], catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


def cli_process(url: str, *args: str | bytes) -> CliResult:
    """Run the command line as a separate process, with arguments given as raw bytes where needed."""
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "--database-url", url, *args],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    return CliResult(
        result.returncode, result.stdout.decode("utf-8", "replace"), result.stderr.decode("utf-8", "replace")
    )


def assert_one_error_line(result: CliResult, code: int) -> str:
    """The CLI failed with `code` and printed one `error:` line (and schema details at most), no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), result.stderr
    assert all(line.startswith("  - ") for line in lines[1:]), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def cli_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A SQLite deployment shared by the CLI cases, each of which must leave it unchanged."""
    url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'cli.db'}"
    turn_store = store.SqlAgentTurnStore(url)
    engine = sa.create_engine(url)
    try:
        runner = AgentRunner(turn_store=turn_store)
        form_turn = runner.run(_agent(), "fill in the form")
        approval_turn = runner.run(_agent(), "deploy the api")
        question_turn = runner.suspend(runner.start(_agent(), "ask me"), AgentSuspension.user_input("which order?"))
        yield Deployment(url, runner, engine, None, "", form_turn, approval_turn, question_turn)
    finally:
        turn_store.close()
        engine.dispose()


CLI_BAD_INPUT: list[Any] = [
    pytest.param(["turns", "list", "--limit", "1e20"], "--limit", id="limit-1e20"),
    pytest.param(["turns", "list", "--limit", "-1"], "--limit", id="limit-negative"),
    pytest.param(["turns", "list", "--limit", "0"], "--limit", id="limit-zero"),
    pytest.param(["turns", "list", "--limit", "abc"], "--limit", id="limit-text"),
    pytest.param(["turns", "list", "--limit", "99999999999999999999"], "--limit", id="limit-huge"),
    pytest.param(["turns", "list", "--status", "NOPE"], "--status", id="status-unknown"),
    pytest.param(["turns", "list", "--conversation", NON_UTF8], "--conversation", id="conversation-non-utf8"),
    pytest.param(["turns", "list", "--conversation", SQL_INJECTION], "--conversation", id="conversation-sql"),
    pytest.param(["turns", "show", ""], "TURN_ID", id="show-empty"),
    pytest.param(["turns", "show", NON_UTF8], "TURN_ID", id="show-non-utf8"),
    pytest.param(["turns", "show", "t" * 100_000], "TURN_ID", id="show-100k-id"),
    pytest.param(["turns", "show", SQL_INJECTION], "TURN_ID", id="show-sql"),
    pytest.param(["turns", "show", "no-such-turn"], "does not exist", id="show-unknown"),
    pytest.param(["cancel", NON_UTF8], "TURN_ID", id="cancel-non-utf8"),
    pytest.param(["cancel", "no-such-turn"], "does not exist", id="cancel-unknown"),
    pytest.param(["cancel", "{approval}", "--reason", NON_UTF8], "--reason", id="cancel-reason-non-utf8"),
    pytest.param(["resume", NON_UTF8, "--retry"], "turn_id", id="resume-non-utf8-turn"),
    pytest.param(["resume", "{question}", "--input", NON_UTF8], "content", id="resume-non-utf8-input"),
    pytest.param(["resume", "{form}", "--form", NON_UTF8, "{}"], "tool_call_id", id="resume-non-utf8-call"),
    pytest.param(["resume", "{form}", "--form", "call-form", "[" * 100_000], "--form", id="form-deep-json"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a":' * 65 + "1" + "}" * 65], "64", id="form-65"),
    pytest.param(["resume", "{form}", "--form", "call-form", "{"], "not valid JSON", id="form-broken-json"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a": NaN}'], "NaN", id="form-nan"),
    pytest.param(["resume", "{form}", "--form", "call-form", "[1]"], "JSON object", id="form-list"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a": ' + "9" * 5000 + "}"], "JSON", id="form-digits"),
    pytest.param(["resume", "{form}", "--form", "call-form", '{"a": "\\u0000"}'], "NUL", id="form-nul-escape"),
    pytest.param(["resume", "{approval}", "--approve", "call-deploy", "--retry"], "exactly one", id="two-actions"),
    pytest.param(["resume", "{approval}"], "exactly one", id="no-action"),
    pytest.param(["resume", "{approval}", "--approve", "wrong-call"], "wrong-call", id="stale-call"),
    pytest.param(
        ["resume", "{approval}", "--approve", "call-deploy", "--reason", NON_UTF8],
        "--reason",
        id="approve-reason-non-utf8",
    ),
    pytest.param(["resume", "{approval}", "--mark-done", NON_UTF8, "x"], "tool_call_id", id="mark-done-non-utf8"),
    pytest.param(["resume", "{question}", "--input", "x", "--reason", "why"], "--reason", id="reason-without-decision"),
    pytest.param(["worker", "--concurrency", "0"], "--concurrency", id="worker-concurrency"),
    pytest.param(["worker", "--lease-ttl", "-5"], "--lease-ttl", id="worker-lease-ttl"),
    pytest.param(["worker", "--lease-ttl", "nan"], "finite", id="worker-lease-ttl-nan"),
    pytest.param(["worker", "--run-for", "inf"], "finite", id="worker-run-for-inf"),
    pytest.param(["no-such-command"], "No such command", id="unknown-command"),
    pytest.param(["turns", "list", "--bogus"], "--bogus", id="unknown-option"),
]


@pytest.mark.parametrize(("arguments", "shown"), CLI_BAD_INPUT)
def test_cli_bad_input_is_one_error_line_with_exit_2(
    cli_deployment: Deployment, arguments: list[str], shown: str
) -> None:
    turns = {
        "{form}": cli_deployment.form_turn.id,
        "{approval}": cli_deployment.approval_turn.id,
        "{question}": cli_deployment.question_turn.id,
    }
    arguments = [turns.get(a, a) for a in arguments]
    before = cli_deployment.digest()
    line = assert_one_error_line(cli(cli_deployment.url, *arguments), 2)
    assert shown in line
    assert cli_deployment.digest() == before


def test_cli_arguments_that_are_not_utf8_are_one_error_line_in_a_real_process(cli_deployment: Deployment) -> None:
    # Given raw bytes as the operating system hands them to the process
    before = cli_deployment.digest()
    question = cli_deployment.question_turn.id
    cases: list[list[str | bytes]] = [["turns", "show", b"\xff\xfe"], ["resume", question, "--input", b"caf\xe9"]]
    for arguments in cases:
        # Then the process prints one line naming the bytes, exits 2 and changes nothing
        line = assert_one_error_line(cli_process(cli_deployment.url, *arguments), 2)
        assert "U+DC" in line or "\\x" in line
    assert cli_deployment.digest() == before


def test_cli_store_failures_are_one_error_line_with_exit_1(tmp_path: Path) -> None:
    # Given a file that is not a database, and a server that does not answer (with a password in its URL)
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"this is not a SQLite file" * 100)
    unreachable = "postgresql+psycopg://user:s3cret-pw@127.0.0.1:1/db"
    for url in (f"sqlite:///{broken}", unreachable):
        for arguments in (["turns", "list"], ["turns", "show", "abc"], ["cancel", "abc"], ["resume", "abc", "--retry"]):
            # Then every command fails with one line, exit 1, and never shows the password
            line = assert_one_error_line(cli(url, *arguments), 1)
            assert "s3cret-pw" not in line
    line = assert_one_error_line(cli_process(unreachable, "turns", "list"), 1)
    assert "s3cret-pw" not in line
    assert broken.read_bytes() == b"this is not a SQLite file" * 100


@pytest.mark.parametrize(
    "url",
    ["postgresql+psycopg//user:s3cret-pw@host/db", "nosuchdriver://user:s3cret-pw@host/db", "postgres:/u:s3cret-pw@h"],
    ids=["no-scheme-separator", "unknown-driver", "one-slash"],
)
def test_cli_malformed_database_url_is_bad_input_and_hides_the_password(url: str) -> None:
    for arguments in (["turns", "list"], ["db", "upgrade"]):
        line = assert_one_error_line(cli(url, *arguments), 2)
        assert "s3cret-pw" not in line and "***" in line


# --- Settings --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENT_RUNNER_DATABASE_URL", "postgresql+psycopg//user:s3cret-pw@db/agent"),
        ("AGENT_RUNNER_DATABASE_URL", "postgres:/user:s3cret-pw@db/agent"),
        ("AGENT_RUNNER_DATABASE_URL", "user:s3cret-pw@db:5432/agent"),
        ("AGENT_RUNNER_DATABASE_URL", "postgresql://user:s3cret-pw@db:port/agent"),
        ("AGENT_RUNNER_REDIS_URL", "redis:/x:s3cret-pw@h"),
        ("AGENT_RUNNER_REDIS_URL", "redis//:s3cret-pw@h:6379/0"),
        ("AGENT_RUNNER_REDIS_URL", "redis://:s3cret-pw@h:99999/0"),
        ("CELERY_BROKER_URL", "amqp//guest:s3cret-pw@rabbit//"),
        ("CELERY_BROKER_URL", "amqp:guest:s3cret-pw@rabbit"),
    ],
)
def test_settings_errors_never_show_a_password(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        WorkerSettings.from_env({variable: value})
    assert caught.value.variable == variable
    assert "s3cret-pw" not in str(caught.value) and "s3cret-pw" not in repr(caught.value.value)
    assert "***" in str(caught.value)


def test_settings_mask_a_password_holding_an_at_sign() -> None:
    with pytest.raises(SettingsError) as caught:
        WorkerSettings.from_env({"AGENT_RUNNER_DATABASE_URL": "postgres:/user:pa@ss:w/rd@db/agent"})
    assert "pa@ss" not in str(caught.value) and "w/rd" not in str(caught.value)


UNENCODED_PASSWORD = "Kq@Zx?Wv#Yj/Tm42"
PASSWORD_PIECES = ("Kq", "Zx", "Wv", "Yj", "Tm42")
"""The pieces of `UNENCODED_PASSWORD` between its delimiters: URL parsers take them for a host, path or query."""

UNENCODED_URLS = [
    f"postgresql+psycopg://app:{UNENCODED_PASSWORD}@db.internal:5432/agents",
    f"redis://:{UNENCODED_PASSWORD}@cache:6379/0",
    f"rediss://app:{UNENCODED_PASSWORD}@cache:6380/2?ssl_cert_reqs=none",
    f"amqp://guest:{UNENCODED_PASSWORD}@rabbit:5672//",
]


def assert_no_password_piece(text: str) -> None:
    shown = [piece for piece in PASSWORD_PIECES if piece in text]
    assert shown == [], f"{shown} of the password shown in {text!r}"


@pytest.mark.parametrize("url", UNENCODED_URLS)
def test_masking_a_url_whose_password_holds_delimiters_shows_none_of_it(url: str) -> None:
    from store._redaction import mask_url_secrets, redact_url, url_secrets

    for shown in (redact_url(url), mask_url_secrets(url), mask_url_secrets(f"connecting to {url} failed")):
        assert_no_password_piece(shown)
        assert "***" in shown
    assert UNENCODED_PASSWORD in url_secrets(url)


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("AGENT_RUNNER_DATABASE_URL", UNENCODED_URLS[0]),
        ("AGENT_RUNNER_REDIS_URL", UNENCODED_URLS[1]),
        ("CELERY_BROKER_URL", UNENCODED_URLS[3]),
    ],
)
def test_settings_refuse_a_password_with_unencoded_delimiters_and_show_none_of_it(variable: str, url: str) -> None:
    with pytest.raises(SettingsError, match="percent-encode") as caught:
        WorkerSettings.from_env({variable: url})
    assert_no_password_piece(str(caught.value))


def test_stores_refuse_a_password_with_unencoded_delimiters_and_show_none_of_it() -> None:
    with pytest.raises(StoreError, match="percent-encode") as refused:
        store.make_engine(UNENCODED_URLS[0])
    assert_no_password_piece(str(refused.value))
    with pytest.raises(ValueError, match="percent-encode") as refused_redis:
        store.RedisTurnLease(UNENCODED_URLS[1])
    assert_no_password_piece(str(refused_redis.value))
    # A percent-encoded password is accepted
    store.make_engine("postgresql+psycopg://app:Kq%40Zx%3FWv%23Yj%2FTm42@db.internal:5432/agents").dispose()


def test_the_cli_refuses_a_database_url_with_unencoded_delimiters_in_one_line_without_the_password() -> None:
    line = assert_one_error_line(cli(UNENCODED_URLS[0], "turns", "list"), 2)
    assert_no_password_piece(line)


# --- Forged Celery messages (the entry points, called as Celery calls them) -----------------------


FORGED: list[Any] = [
    pytest.param("step", (), {}, id="step-no-arguments"),
    pytest.param("step", ("t",), {}, id="step-one-argument"),
    pytest.param("step", ("t", 1, 2), {}, id="step-three-arguments"),
    pytest.param("step", ("t", "1"), {}, id="step-version-str"),
    pytest.param("step", ("t", None), {}, id="step-version-none"),
    pytest.param("step", ("t", True), {}, id="step-version-bool"),
    pytest.param("step", ("t", 1.5), {}, id="step-version-float"),
    pytest.param("step", (1, 1), {}, id="step-id-int"),
    pytest.param("step", (["t"], 1), {}, id="step-id-list"),
    pytest.param("step", ({"t": 1}, 1), {}, id="step-id-dict"),
    pytest.param("step", ("", 1), {}, id="step-id-empty"),
    pytest.param("step", ("t" * 1_000_000, 1), {}, id="step-id-1MB"),
    pytest.param("step", ("t\x00", 1), {}, id="step-id-nul"),
    pytest.param("step", (SQL_INJECTION, 1), {}, id="step-id-sql"),
    pytest.param("step", ("t",), {"version": 1, "extra": 2}, id="step-unknown-keyword"),
    pytest.param("step", ("t", 1), {"turn_id": "t"}, id="step-twice"),
    pytest.param("inbox", (), {}, id="inbox-no-arguments"),
    pytest.param("inbox", (None,), {}, id="inbox-none"),
    pytest.param("inbox", ("c", "d"), {}, id="inbox-two"),
    pytest.param("inbox", ("c\ud800",), {}, id="inbox-surrogate"),
    pytest.param("inbox", ("t/c/d",), {}, id="inbox-two-slashes"),
    pytest.param("inbox", ("t.1/c",), {}, id="inbox-tenant-outside-the-tenant-rules"),
    pytest.param("inbox", ("/c",), {}, id="inbox-empty-tenant"),
    pytest.param("sweep_inbox", (1,), {}, id="sweep-inbox-argument"),
    pytest.param("sweep_stale_turns", (), {"x": 1}, id="sweep-stale-keyword"),
    pytest.param("sweep_due_retries", ("now",), {}, id="sweep-retries-argument"),
]


def test_a_tenants_conversation_id_passes_the_inbox_tasks_argument_check(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.celery_app import tasks
    from workers.inbox import InboxOutcome

    # Given a worker whose inbox dispatch is observed (no wiring is built)
    served: list[str] = []

    def serve(_wiring: object, conversation_id: str) -> InboxOutcome:
        served.append(conversation_id)
        return InboxOutcome.EMPTY

    monkeypatch.setattr(tasks, "current", lambda: None)
    monkeypatch.setattr(tasks, "start_next_message", serve)
    # When dispatch requests arrive for a tenant's conversation and for a plain one
    with caplog.at_level(logging.WARNING):
        outcomes = [tasks._dispatch_inbox("tenant-a/c-1"), tasks._dispatch_inbox(conversation_id="c-1")]
    # Then both reach the dispatch, nothing is rejected and nothing is logged
    assert outcomes == ["empty", "empty"] and served == ["tenant-a/c-1", "c-1"]
    assert caplog.records == []


@pytest.mark.parametrize(("task", "args", "kwargs"), FORGED)
def test_forged_task_arguments_are_rejected_with_one_warning(
    caplog: pytest.LogCaptureFixture, task: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    from workers.celery_app import beat, tasks

    entries: dict[str, Callable[..., Any]] = {
        "step": tasks._step_turn,
        "inbox": tasks._dispatch_inbox,
        "sweep_inbox": beat.SWEEP_ENTRIES["inbox"],
        "sweep_stale_turns": beat.SWEEP_ENTRIES["stale_turns"],
        "sweep_due_retries": beat.SWEEP_ENTRIES["due_retries"],
    }
    entry = entries[task]
    with caplog.at_level(logging.DEBUG):
        outcome = entry(*args, **kwargs)
    # Rejected before any wiring (database, Redis, broker) was built or touched
    assert outcome in ("rejected", 0)
    [record] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert "rejected" in record.getMessage() and "not retried" in record.getMessage()
    assert len(record.getMessage()) < 400  # the forged values themselves are not echoed
