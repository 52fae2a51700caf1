"""Hostile input shared by the tests of each surface: nasty values, an agent with every kind of wait, and deployments.

A `Deployment` is a runner on a real SQL store (and, on PostgreSQL, the Redis conversation
guard) holding three waiting turns: one on a form, one on an approval and one on a plain
question. Its `digest` covers every row of every table and every Redis key of the test, so
a test can show that a refused input wrote nothing.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from redis import Redis

import store
from agent_runner import (
    Agent,
    AgentFormDefinition,
    AgentRunner,
    AgentRunnerError,
    AgentSuspension,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    ChatRequest,
    InputLimitError,
    ScriptedChatModel,
    ToolCall,
    UserMessage,
    tool,
)
from tests.helpers.scenarios import deploy

TEST_REDIS_URL = os.environ.get("AGENT_RUNNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
SQL_INJECTION = "x'; DROP TABLE agent_turns; --"
NON_UTF8 = b"caf\xe9".decode("utf-8", "surrogateescape")
"""What Python makes of a Latin-1 command-line argument on a UTF-8 system: a lone surrogate."""

FORM = AgentFormDefinition(
    key="details",
    description="ticket details",
    schema={"type": "object", "properties": {"system": {"type": "string"}}, "additionalProperties": {"$ref": "#"}},
)


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


def hostile_reply(request: ChatRequest) -> AiMessage:
    """Asks for the form, or to deploy, when told to; answers anything else."""
    last = request.messages[-1]
    if isinstance(last, UserMessage) and last.content == "fill in the form":
        return AiMessage(
            tool_calls=[ToolCall(id="call-form", name="request_user_input", arguments={"formKey": "details"})]
        )
    if isinstance(last, UserMessage) and last.content == "deploy the api":
        return AiMessage(tool_calls=[ToolCall(id="call-deploy", name="deploy", arguments={"service": "api"})])
    return AiMessage(content="done")


def hostile_agent() -> Agent:
    """An agent with a tool needing approval, a JSON-anything tool and a form."""
    return Agent(
        id="ops",
        chat_model=ScriptedChatModel(hostile_reply),
        tools=[deploy, inspect_data, AgentUserInputTool(forms=[FORM])],
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
        form_turn = runner.run(hostile_agent(), "fill in the form", conversation_id="c-form", tenant_id="tenant-a")
        approval_turn = runner.run(hostile_agent(), "deploy the api", conversation_id="c-approval")
        question_turn = runner.suspend(
            runner.start(hostile_agent(), "ask me"), AgentSuspension.user_input("which order?")
        )
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
