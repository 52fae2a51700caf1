"""Does a step's save cost grow with the turn's history? SqlAgentTurnStore on PostgreSQL.

For histories of 10, 100, 1,000 and 5,000 messages, a turn takes steps that each add one
message and change the header, as the runner does, and every save is timed. Printed per
history length (median of 3 runs): mean save time, statements per save,
bytes handed to the driver per save, WAL bytes per save (server-wide, so other activity
on the server adds noise) and server transactions per save (likewise server-wide), each
byte count with its ratio to the 10-message case.

Two in-run references: the floor (a transaction that inserts one small row), and a store
that rewrites the whole snapshot as one JSON row per save, which is what the append-only
message table avoids.

Run: `python bench/store_growth.py [--quick] [--json PATH]` (PostgreSQL from
AGENT_RUNNER_BENCH_DATABASE_URL, else postgresql+psycopg://postgres@127.0.0.1:5432/test).
Everything happens in a temporary schema that is dropped at the end.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
from _common import DriverBytes, arguments, database_url, libpq, log, pg_schema, write_results
from sqlalchemy.engine import make_url

import store
from agent_runner import AgentTurn, AgentTurnStatus, AiMessage, ToolCall, ToolMessage, Usage, UserMessage

HISTORIES = (10, 100, 1000, 5000)
RUNS = 3
STEPS = 200
SNAPSHOT_STEPS = 30
WARMUP = 10


@dataclass
class Measure:
    save_ms: float
    statements: float
    transactions: float
    payload_bytes: float
    wal_bytes: float


def message(index: int) -> UserMessage | AiMessage | ToolMessage:
    """A realistic mix: user questions, tool-calling answers, tool results (about 200-400 bytes each)."""
    kind = index % 3
    if kind == 0:
        return UserMessage(id=f"m-{index}", content=f"question {index}: where is order {1000 + index}? " + "x" * 120)
    if kind == 1:
        call = ToolCall(f"call-{index}", "lookup_order", {"order_id": f"O-{1000 + index}", "fields": ["status", "eta"]})
        return AiMessage(id=f"m-{index}", content="Let me check that for you.", tool_calls=[call])
    return ToolMessage(
        id=f"m-{index}",
        tool_call_id=f"call-{index - 1}",
        tool_name="lookup_order",
        content=json.dumps({"order": f"O-{999 + index}", "status": "shipped", "eta": "2026-12-01", "notes": "y" * 100}),
    )


def turn_with_history(turn_id: str, length: int) -> AgentTurn:
    return AgentTurn(id=turn_id, agent_id="bench", root_turn_id=turn_id, messages=[message(i) for i in range(length)])


def next_step(turn: AgentTurn) -> AgentTurn:
    return turn.model_copy(
        update={
            "messages": [*turn.messages, message(len(turn.messages))],
            "status": AgentTurnStatus.RUNNING,
            "steps": turn.steps + 1,
            "model_iterations": turn.model_iterations + 1,
            "usage": turn.usage + Usage(input_tokens=120, output_tokens=30, cost=0.0004),
            "updated_at": turn.updated_at + timedelta(milliseconds=1),
        }
    )


def next_transaction_id(admin: psycopg.Connection[Any]) -> int:
    # Every writing transaction on the server takes the next id, whether it was committed
    # explicitly or ran as one autocommitted statement; reading it assigns none.
    row = admin.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def wal_position(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
    assert row is not None
    return int(row[0])


def measure(
    steps: int, counters: DriverBytes, admin: psycopg.Connection[Any], save_one: Callable[[int], float]
) -> Measure:
    for index in range(WARMUP):
        save_one(index)
    counters.take()
    wal_before = wal_position(admin)
    xid_before = next_transaction_id(admin)
    elapsed = sum(save_one(WARMUP + index) for index in range(steps))
    transactions = next_transaction_id(admin) - xid_before
    wal_bytes = wal_position(admin) - wal_before
    return Measure(
        save_ms=elapsed / steps * 1000,
        statements=counters.statements / steps,
        transactions=transactions / steps,
        payload_bytes=counters.bytes / steps,
        wal_bytes=wal_bytes / steps,
    )


def bench_sql_store(url: str, admin: psycopg.Connection[Any], length: int, run: int) -> Measure:
    engine = store.make_engine(url)
    turns = store.SqlAgentTurnStore(engine)
    counters = DriverBytes(engine)
    state = {"turn": turns.save(turn_with_history(f"t-{length}-{run}", length), -1)}

    def save_one(_: int) -> float:
        turn = next_step(state["turn"])
        started = time.perf_counter()
        state["turn"] = turns.save(turn, turn.version)
        return time.perf_counter() - started

    try:
        return measure(STEPS, counters, admin, save_one)
    finally:
        engine.dispose()


snapshot_rows = sa.Table(
    "bench_whole_snapshots",
    sa.MetaData(),
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("snapshot", sa.JSON, nullable=False),
)


def bench_whole_snapshot(url: str, admin: psycopg.Connection[Any], length: int, run: int) -> Measure:
    """Reference: the same steps saved as one compare-and-swapped row holding the whole snapshot."""
    engine = store.make_engine(url)
    snapshot_rows.create(engine, checkfirst=True)
    counters = DriverBytes(engine)
    turn = turn_with_history(f"s-{length}-{run}", length).model_copy(update={"version": 0})
    with engine.begin() as connection:
        connection.execute(
            sa.insert(snapshot_rows).values(id=turn.id, version=0, snapshot=turn.model_dump(mode="json"))
        )
    state = {"turn": turn}

    def save_one(_: int) -> float:
        current = state["turn"]
        updated = next_step(current).model_copy(update={"version": current.version + 1})
        started = time.perf_counter()
        with engine.begin() as connection:
            result = connection.execute(
                sa.update(snapshot_rows)
                .where(snapshot_rows.c.id == updated.id, snapshot_rows.c.version == current.version)
                .values(version=updated.version, snapshot=updated.model_dump(mode="json"))
            )
            assert result.rowcount == 1
        state["turn"] = updated
        return time.perf_counter() - started

    try:
        return measure(SNAPSHOT_STEPS, counters, admin, save_one)
    finally:
        engine.dispose()


def bench_floor(url: str, admin: psycopg.Connection[Any]) -> float:
    """Mean milliseconds of a transaction inserting one small row: the cost of a commit here."""
    engine = store.make_engine(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE IF NOT EXISTS bench_floor (id serial PRIMARY KEY, v int)")
        timings = []
        for index in range(STEPS + WARMUP):
            started = time.perf_counter()
            with engine.begin() as connection:
                connection.exec_driver_sql("INSERT INTO bench_floor (v) VALUES (%(v)s)", {"v": index})
            timings.append(time.perf_counter() - started)
        return statistics.mean(timings[WARMUP:]) * 1000
    finally:
        engine.dispose()


def median_measure(measures: list[Measure]) -> Measure:
    return Measure(
        save_ms=statistics.median(m.save_ms for m in measures),
        statements=statistics.median(m.statements for m in measures),
        transactions=statistics.median(m.transactions for m in measures),
        payload_bytes=statistics.median(m.payload_bytes for m in measures),
        wal_bytes=statistics.median(m.wal_bytes for m in measures),
    )


def print_table(title: str, results: dict[int, Measure]) -> None:
    base = results[HISTORIES[0]]
    print(f"\n{title}")
    header = (
        f"{'history':>8} {'save ms':>9} {'ratio':>6} {'stmts':>6} {'xacts':>6} "
        f"{'sent B':>10} {'ratio':>7} {'WAL B':>10} {'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for length, m in results.items():
        print(
            f"{length:>8} {m.save_ms:>9.3f} {m.save_ms / base.save_ms:>6.2f} {m.statements:>6.1f} {m.transactions:>6.2f} "
            f"{m.payload_bytes:>10.0f} {m.payload_bytes / base.payload_bytes:>7.2f} "
            f"{m.wal_bytes:>10.0f} {m.wal_bytes / base.wal_bytes:>7.2f}"
        )


def main() -> None:
    args = arguments(__doc__)  # --quick changes nothing here: the whole run takes seconds
    url = database_url()
    log("store growth: save cost against history length")
    print(f"PostgreSQL: {make_url(url).render_as_string(hide_password=True)}; median of {RUNS} runs")
    with pg_schema("bench") as (bench_url, _schema), psycopg.connect(libpq(url), autocommit=True) as admin:
        floor = statistics.median(bench_floor(bench_url, admin) for _ in range(RUNS))
        sql_results = {
            length: median_measure([bench_sql_store(bench_url, admin, length, run) for run in range(RUNS)])
            for length in HISTORIES
        }
        snapshot_results = {
            length: median_measure([bench_whole_snapshot(bench_url, admin, length, run) for run in range(RUNS)])
            for length in HISTORIES
        }
    write_results(
        args.json,
        {
            "floor_ms": floor,
            "steps": STEPS,
            "snapshot_steps": SNAPSHOT_STEPS,
            "runs": RUNS,
            "sql_store": {str(length): asdict(m) for length, m in sql_results.items()},
            "whole_snapshot": {str(length): asdict(m) for length, m in snapshot_results.items()},
        },
    )
    print(f"\nfloor: a one-row INSERT transaction takes {floor:.3f} ms")
    print_table(f"SqlAgentTurnStore.save, {STEPS} steps per run (header UPDATE + new-message INSERT)", sql_results)
    print_table(
        f"reference: whole snapshot rewritten as one JSON row, {SNAPSHOT_STEPS} steps per run", snapshot_results
    )
    at_1000 = sql_results[1000].save_ms / sql_results[10].save_ms
    print(f"\n1000-message step / 10-message step: {at_1000:.2f}x (goal: at most 1.2x)")
    print(f"transactions per save: {sql_results[1000].transactions:.2f} (goal: 1)")


if __name__ == "__main__":
    main()
