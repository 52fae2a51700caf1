"""Turns and a statement recorder shared by the SQL store tests of this folder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.interfaces import DBAPICursor, ExecutionContext

from agent_runner import AgentTurn, AgentTurnStatus, AiMessage, ModelMessage, UserMessage
from tests.helpers.pg_backends import killed_while_waiting


@dataclass
class Recorded:
    """What an engine sent while `recording` watched it."""

    statements: list[str] = field(default_factory=list)
    """The first keyword of each statement, upper-cased (`SELECT`, `UPDATE`, `WITH`, ...)."""
    parameter_chars: int = 0
    """The total length of the statements' parameters as text: a measure of the bytes written."""
    commits: int = 0


@contextmanager
def recording(engine: Engine) -> Iterator[Recorded]:
    """Record every statement and commit `engine` makes until the block ends."""
    recorded = Recorded()

    def before(
        conn: Connection,
        cursor: DBAPICursor,
        statement: str,
        parameters: object,
        context: ExecutionContext | None,
        executemany: bool,
    ) -> None:
        if statement.startswith("BEGIN"):
            return  # SQLite's own BEGIN, emitted by the store's engine setup
        recorded.statements.append(statement.split()[0].upper())
        recorded.parameter_chars += len(repr(parameters))

    def commit(conn: Connection) -> None:
        recorded.commits += 1

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "commit", commit)
    try:
        yield recorded
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "commit", commit)


def turn_with_history(turn_id: str, length: int) -> AgentTurn:
    """A new turn holding `length` user messages of about 210 characters each."""
    history: list[ModelMessage] = [
        UserMessage(id=f"{turn_id}-{i}", content=f"message {i} " + "x" * 200) for i in range(length)
    ]
    return AgentTurn(id=turn_id, agent_id="a", root_turn_id=turn_id, messages=history)


def step(turn: AgentTurn) -> AgentTurn:
    """`turn` after one more step: a reply of fixed size appended, the step counted, status RUNNING."""
    reply = AiMessage(id=f"{turn.id}-r{len(turn.messages)}", content="a reply of fixed size " + "y" * 200)
    return turn.model_copy(
        update={"messages": [*turn.messages, reply], "steps": turn.steps + 1, "status": AgentTurnStatus.RUNNING}
    )


def killed_mid_statement(
    admin: psycopg.Connection[tuple[Any, ...]], action: Callable[[], AgentTurn], what: str
) -> list[BaseException | AgentTurn]:
    """Run `action` (a save held inside the server by a lock) on a thread, kill its backend, and return its outcome.

    The save's single statement (`WITH header ...`) must be waiting on a lock another
    transaction holds; its backend is terminated while it waits, and the outcome (the
    saved turn or the exception) is returned once the thread ended.
    """
    return killed_while_waiting(admin, action, "WITH header", what)
