"""Agents of the chaos tests, loaded by the Celery workers through `AGENT_RUNNER_AGENT_LOADER` (see `LOADER`).

Two families of tools, each writing its side effect to the test's PostgreSQL schema
(`AGENT_RUNNER_TEST_LEDGER_URL`) over a psycopg connection of its own, apart from the
connections of the turn store:

- `apply_change` needs a person's approval and is idempotent the usual way: its effect
  is keyed by the call's idempotency key, so a retry after a lost connection cannot apply
  it twice. Its connections carry the application name in `TOOL_APPLICATION_VARIABLE`, by
  which the test finds and terminates them in the middle of calls. `chaos_calls` counts,
  per idempotency key, the executions that started, lost their connection, committed the
  effect statement and returned.
- `create_ticket` is not idempotent (`@tool(idempotent=False)`): every execution that
  commits creates one more ticket, as an API without idempotency keys would. It comes in
  two agents, one whose tool has a reconcile function (it looks the ticket up by the
  idempotency key it stores) and one without. `tests.helpers.crash.pause_this_process_once`
  holds a worker at a chosen point of a call for the test to kill it: before the body (the
  start is saved) and after it (the ticket is committed, the result not saved) in the
  middleware `SETUP` installs, during the body (its insert is sent, not committed) in the
  body itself. With `fail_after_commit` the first execution of a call commits its ticket
  and then raises `TimeoutError`, as a client whose answer was lost on the way back does;
  the reconcile function counts its calls in `chaos_calls` (see `reconcile_calls`).

A turn's user message is a JSON scenario, `{"label": ..., "changes": n}` for `change-agent`
and `{"label": ..., "fail_after_commit": bool}` for the ticket agents. The model's call ids are random: a model asked
again after a tool ran would make a call with a new idempotency key, visible as a second
effect of the same action.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa

from agent_runner import (
    Agent,
    AgentRunner,
    AgentToolContext,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentLoader,
    Middleware,
    RetryPolicy,
    Tool,
    ToolCall,
    ToolOutcome,
    tool,
)
from tests.conftest import libpq_url
from tests.helpers.crash import pause_this_process_once
from tests.helpers.scenarios import fresh_call, opening
from tests.integration.celery_workers.celery_agents import LEDGER_URL_VARIABLE, ledger_engine

LOADER = f"{__name__}:build_loader"
"""`module:attribute` of the agents, for `AGENT_RUNNER_AGENT_LOADER`."""
SETUP = f"{__name__}:setup_runner"
"""`module:function` of the runner set-up, for `AGENT_RUNNER_SETUP`."""
TOOL_APPLICATION_VARIABLE = "AGENT_RUNNER_TEST_TOOL_APPLICATION"
"""The application name of the connections of `apply_change` (one per test)."""
WORK_S = 0.03
"""How long `apply_change` holds its transaction open (the system of record takes a moment)."""
CHANGE_RETRY = RetryPolicy(max_attempts=40, initial_backoff=0.05, multiplier=1.5, max_backoff=0.4, jitter=0.2)
"""The retry schedule of `change-agent`. Its `retry_on` is the default one: nothing tells the
runner that psycopg errors are transient but the policy's own defaults."""
BEFORE, DURING, AFTER = "before-body", "during-body", "after-body"
"""The points of a `create_ticket` call at which a worker can be held for the test to kill it."""
POINTS = (BEFORE, DURING, AFTER)

metadata = sa.MetaData()
chaos_effects = sa.Table(
    "chaos_effects",
    metadata,
    sa.Column("idempotency_key", sa.String, primary_key=True),
    sa.Column("change", sa.String, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)
chaos_calls = sa.Table(
    "chaos_calls",
    metadata,
    sa.Column("idempotency_key", sa.String, primary_key=True),
    sa.Column("change", sa.String, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
    sa.Column("commits", sa.Integer, nullable=False, server_default="0"),
    sa.Column("returns", sa.Integer, nullable=False, server_default="0"),
)
chaos_tickets = sa.Table(
    "chaos_tickets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("idempotency_key", sa.String, nullable=False),  # not unique: the API does not dedupe
    sa.Column("turn_id", sa.String, nullable=False),
    sa.Column("title", sa.String, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)


# --- apply_change: an approved, idempotent write over a connection that may be cut -------------

_connection_lock = threading.Lock()
_connection: tuple[int, psycopg.Connection[Any]] | None = None


def _tool_connection() -> psycopg.Connection[Any]:
    """This process's connection of `apply_change`, opened on first use and after it was lost."""
    global _connection
    with _connection_lock:
        if _connection is None or _connection[0] != os.getpid() or _connection[1].closed:
            connection = psycopg.connect(
                libpq_url(os.environ[LEDGER_URL_VARIABLE]),
                autocommit=True,
                application_name=os.environ[TOOL_APPLICATION_VARIABLE],
                connect_timeout=5,
            )
            _connection = (os.getpid(), connection)
        return _connection[1]


def _drop_tool_connection() -> None:
    global _connection
    with _connection_lock:
        if _connection is not None and _connection[0] == os.getpid():
            _connection[1].close()
        _connection = None


def _count(key: str, change: str, column: str) -> None:
    """Add one to `column` of the call's `chaos_calls` row, over the ledger connection (never cut)."""
    statement = sa.text(
        f"INSERT INTO chaos_calls (idempotency_key, change, {column}) VALUES (:key, :change, 1) "
        f"ON CONFLICT (idempotency_key) DO UPDATE SET {column} = chaos_calls.{column} + 1"
    )
    with ledger_engine().begin() as connection:
        connection.execute(statement, {"key": key, "change": change})


@tool(requires_approval=True)
def apply_change(change: str) -> str:
    """Apply one change to the system of record, once a person approved it."""
    key = AgentToolContext.current().get_idempotency_key()
    _count(key, change, "attempts")
    try:
        connection = _tool_connection()
        with connection.transaction():
            connection.execute(
                "INSERT INTO chaos_effects (idempotency_key, change, pid) VALUES (%s, %s, %s) "
                "ON CONFLICT (idempotency_key) DO NOTHING",
                [key, change, os.getpid()],
            )
            connection.execute("SELECT pg_sleep(%s)", [WORK_S])
            # In the effect's transaction: counts the executions whose effect statement
            # committed, including one whose commit went through but whose answer was lost.
            connection.execute("UPDATE chaos_calls SET commits = commits + 1 WHERE idempotency_key = %s", [key])
    except psycopg.Error:
        _drop_tool_connection()
        _count(key, change, "failures")
        raise  # the runner's retry policy decides whether this is worth another attempt
    _count(key, change, "returns")
    return f"applied {change}"


# --- create_ticket: a non-idempotent call a worker can be killed in -----------------------------


def _create_ticket(title: str, fail_after_commit: bool = False) -> str:
    """Create a ticket (running it twice creates two tickets); see the module docstring for `fail_after_commit`."""
    context = AgentToolContext.current()
    key = context.get_idempotency_key()
    with psycopg.connect(libpq_url(os.environ[LEDGER_URL_VARIABLE]), autocommit=True, connect_timeout=5) as connection:
        with connection.transaction():
            row = connection.execute(
                "INSERT INTO chaos_tickets (idempotency_key, turn_id, title, pid) VALUES (%s, %s, %s, %s) RETURNING id",
                [key, context.turn_id, title, os.getpid()],
            ).fetchone()
            # Held here, the insert is sent and not committed: the kill rolls it back.
            pause_this_process_once(DURING, context.tool_call.id)
        made = connection.execute("SELECT count(*) FROM chaos_tickets WHERE idempotency_key = %s", [key]).fetchone()
    assert row is not None and made is not None
    if fail_after_commit and made[0] == 1:
        raise TimeoutError(f"read timed out after ticket T-{row[0]} was created")
    return ticket_result(int(row[0]))


def ticket_result(ticket_id: int) -> str:
    """What `create_ticket` returns for the ticket `ticket_id` (and what its reconcile function finds)."""
    return f"ticket T-{ticket_id} created"


create_ticket = Tool(_create_ticket, name="create_ticket", idempotent=False)
"""The tool without a reconcile function: a call cut off by a crash is put to a person."""
reconciled_create_ticket = Tool(_create_ticket, name="create_ticket", idempotent=False)
"""The same tool with a reconcile function."""


@reconciled_create_ticket.reconcile
def _find_ticket(call: ToolCall, idempotency_key: str) -> ToolOutcome:
    """Look the ticket up by the idempotency key the body stored with it."""
    _count(reconcile_calls(idempotency_key), "reconcile", "attempts")
    with psycopg.connect(libpq_url(os.environ[LEDGER_URL_VARIABLE]), connect_timeout=5) as connection:
        row = connection.execute(
            "SELECT id FROM chaos_tickets WHERE idempotency_key = %s ORDER BY id", [idempotency_key]
        ).fetchone()
    return ToolOutcome.done(ticket_result(int(row[0]))) if row is not None else ToolOutcome.not_done()


def reconcile_calls(idempotency_key: str) -> str:
    """The `chaos_calls` key whose `attempts` count the reconcile calls for the call `idempotency_key`."""
    return f"reconcile:{idempotency_key}"


class PauseAroundTickets(Middleware):
    """Holds a worker before the body of a `create_ticket` call (its start is saved) or after it (before the save)."""

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        """Pause (see `pause_this_process_once`) around the body of `create_ticket` calls."""
        if tool_call.name != "create_ticket":
            return call_next(tool_call)
        # Outside the body there is no tool context: the call id (random, so unique) names the call.
        pause_this_process_once(BEFORE, tool_call.id)
        result = call_next(tool_call)
        pause_this_process_once(AFTER, tool_call.id)
        return result


def setup_runner(runner: AgentRunner) -> None:
    """Entry point named by `SETUP`: the workers' runners can be held around ticket calls."""
    runner.middleware.append(PauseAroundTickets())


# --- The scripted model and the agents ----------------------------------------------------------


class ScenarioModel:
    """A chat model that plays the scenario of the turn's last user message."""

    def generate(self, request: ChatRequest) -> ChatResponse:
        """The next tool call of the scenario, or the final answer, which quotes the last tool result."""
        turn = opening(request)
        spec = json.loads(turn.text)
        label: str = spec["label"]
        responses = turn.responses
        results = turn.results
        if "changes" in spec:
            if responses < int(spec["changes"]):
                return ChatResponse(
                    message=AiMessage(tool_calls=[fresh_call("apply_change", change=f"{label}:c{responses}")])
                )
        elif responses == 0:
            fail = bool(spec.get("fail_after_commit", False))
            return ChatResponse(
                message=AiMessage(tool_calls=[fresh_call("create_ticket", title=label, fail_after_commit=fail)])
            )
        last = results[-1].content if results else ""
        return ChatResponse(message=AiMessage(content=f"done:{label}:{last}"))


def build_agents() -> list[Agent]:
    """`change-agent`, `ticket-agent` (no reconcile function) and `reconciled-ticket-agent`."""
    model = ScenarioModel()
    return [
        Agent(id="change-agent", chat_model=model, tools=[apply_change], retry=CHANGE_RETRY, max_iterations=50),
        Agent(id="ticket-agent", chat_model=model, tools=[create_ticket]),
        Agent(id="reconciled-ticket-agent", chat_model=model, tools=[reconciled_create_ticket]),
    ]


def build_loader() -> InMemoryAgentLoader:
    """Entry point named by `LOADER`."""
    return InMemoryAgentLoader(build_agents())
