"""Durable, one process, PostgreSQL: the runner with SqlAgentTurnStore against LangGraph with PostgresSaver.

Both sides save every stable boundary before going on: the runner saves each step's
snapshot (one compare-and-swap per step), LangGraph runs with durability "sync" (each
superstep's checkpoint is written before the next starts). Both talk to the same
PostgreSQL server, in the same fresh schema, in the same process, with repetitions
interleaved (ours, then LangGraph, then ours ...) so drift on the machine hits both.

Measured:

1. Throughput on W (K=10, 50, 200) with explicit history (no conversation), and K=10 in a
   conversation (SqlChatMemoryProvider) that is fresh or already holds 500 messages,
   attached with a window of 50 (the default) or 500. LangGraph runs K=10, 50 and 200.
   In each repetition of W K=10 also: the same turns with the event log off (the store
   is handed no events), and the floor, one autocommitted compare-and-swap UPDATE of a row
   as large as a turn's header row, prepared on a raw psycopg connection, as many times as
   the turns take steps.
2. Per-step time and bytes along one K=200 turn, for both: time of each step, WAL bytes
   the server wrote during it, bytes the store handed to the driver as parameters and
   bytes it stored (ours only), and the bytes stored for the whole turn.
3. Per-step time and bytes of a K=10 turn in a conversation with 500 earlier messages
   (windows 50 and 500) against a fresh conversation, and what creating such a turn costs.
4. How many of the saves of W K=10 turns were HOT updates (`pg_stat_user_tables`), in a
   schema of their own.

Run: `python bench/durable.py [--quick] [--json PATH]`.
"""

from __future__ import annotations

import gc
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from _common import (
    DriverBytes,
    Stat,
    arguments,
    libpq,
    log,
    pg_schema,
    prior_messages,
    steps_per_turn,
    w_agent,
    wal_position,
    write_results,
)

import store
from agent_runner import AgentEvent, AgentExecutionPolicy, AgentRunner, AgentTurn

EDGE = 20
"""Steps at the start and at the end of a K=200 turn compared for flatness."""


def make_runner(engine: Any, *, events: bool = True) -> AgentRunner:
    turns = store.SqlAgentTurnStore(engine)
    return AgentRunner(
        turn_store=turns if events else WithoutEventLog(turns),  # type: ignore[arg-type]
        chat_memory_provider=store.SqlChatMemoryProvider(engine),
        policy=AgentExecutionPolicy(max_steps=1000),
    )


class WithoutEventLog:
    """A turn store that saves snapshots without their events: the runner with the event log off."""

    def __init__(self, turns: store.SqlAgentTurnStore) -> None:
        self._turns = turns

    def save(self, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent] = ()) -> AgentTurn:
        return self._turns.save(turn, expected_version, ())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._turns, name)


# --- The floor ------------------------------------------------------------------------------------


class Floor:
    """One autocommitted compare-and-swap UPDATE of a row of a given size, prepared on a raw psycopg connection.

    The least a durable step can cost here: one round trip, one commit (with its WAL flush),
    a row rewritten in place (no indexed column changes, so a HOT update, as ours).
    """

    def __init__(self, libpq_url: str, row_bytes: int) -> None:
        self.connection = psycopg.connect(libpq_url, autocommit=True)
        self.connection.execute(
            "CREATE TABLE bench_floor (id text PRIMARY KEY, version integer NOT NULL, payload text NOT NULL)"
            " WITH (fillfactor = 75)"
        )
        # The payload varies from update to update, as a turn's state does; about the row's size in all.
        self.filler = uuid.uuid4().hex * (max(row_bytes - 60, 32) // 32 + 1)
        self.length = max(row_bytes - 60, 32)
        self.version = 0
        self.connection.execute("INSERT INTO bench_floor VALUES ('floor', 0, %s)", [self.filler[: self.length]])
        self.cursor = self.connection.cursor()

    def update(self) -> None:
        offset = self.version % 32
        self.cursor.execute(
            "UPDATE bench_floor SET version = version + 1, payload = %s WHERE id = 'floor' AND version = %s",
            [self.filler[offset : offset + self.length], self.version],
            prepare=True,
        )
        if self.cursor.rowcount != 1:
            raise RuntimeError("the floor's compare-and-swap did not match")
        self.version += 1

    def run(self, updates: int) -> float:
        """Seconds for `updates` updates in a row."""
        started = time.perf_counter()
        for _ in range(updates):
            self.update()
        return time.perf_counter() - started

    def row_bytes(self) -> int:
        row = self.connection.execute("SELECT pg_column_size(f.*) FROM bench_floor f").fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        self.connection.close()


def header_row_bytes(admin: Any) -> int:
    """The mean size of the header rows of the turns saved so far (pg_column_size)."""
    row = admin.execute("SELECT avg(pg_column_size(t.*))::int FROM agent_turns t").fetchone()
    return int(row[0])


# --- Throughput -----------------------------------------------------------------------------------


def ours_turns(
    runner: AgentRunner, k: int, turns: int, *, window: int = 50, conversation: str | None = None
) -> tuple[float, float]:
    """Run `turns` turns of W(k); return (seconds, CPU seconds of this process). `conversation="fresh"`: a new one each."""
    agent = w_agent(k, window=window)
    cpu = time.process_time()
    started = time.perf_counter()
    for _ in range(turns):
        conversation_id = f"fresh-{uuid.uuid4().hex}" if conversation == "fresh" else conversation
        turn = runner.run(agent, "check my orders", conversation_id=conversation_id)
        if turn.status != "COMPLETED" or turn.steps != steps_per_turn(k):
            raise RuntimeError(f"unexpected end of a W({k}) turn: {turn.status} after {turn.steps} steps")
    return time.perf_counter() - started, time.process_time() - cpu


def langgraph_turns(graph: Any, k: int, turns: int) -> tuple[float, float]:
    import langgraph_peer

    cpu = time.process_time()
    started = time.perf_counter()
    for _ in range(turns):
        state, steps = langgraph_peer.run_turn(graph)
        if steps != steps_per_turn(k) or len(state["messages"]) != steps_per_turn(k) + 1:
            raise RuntimeError(f"unexpected end of a LangGraph W({k}) run: {steps} steps")
    return time.perf_counter() - started, time.process_time() - cpu


def throughput(
    runner: AgentRunner, quiet: AgentRunner, floor: Floor, saver: Any, reps: int, scale: float
) -> dict[str, Any]:
    """`quiet`: the same runner without the event log."""
    import langgraph_peer

    graphs = {k: langgraph_peer.workload_graph(k, saver) for k in (10, 50, 200)}
    # Warm-up: statement caches, pools, imports.
    for k in (10, 200):
        ours_turns(runner, k, 2)
        langgraph_turns(graphs[k], k, 1)
    ours_turns(quiet, 10, 2)
    floor.run(50)
    ours_turns(runner, 10, 2, conversation="fresh")

    memory = runner.chat_memory_provider("prior-500")  # type: ignore[misc]
    memory.append(prior_messages(500, "c"))
    ours_turns(runner, 10, 1, window=500, conversation="prior-500")

    workloads: list[dict[str, Any]] = [
        # Short repetitions, many of them: a burst of other work on the machine spoils one
        # repetition of one side, and the median of the per-repetition ratios shrugs it off.
        {"label": "W K=10", "k": 10, "turns": 30, "lg_turns": 8, "side": True},
        {"label": "W K=50", "k": 50, "turns": 6, "lg_turns": 2},
        {"label": "W K=200", "k": 200, "turns": 1, "lg_turns": 1},
        {"label": "W K=10, fresh conversation", "k": 10, "turns": 15, "conversation": "fresh"},
        {"label": "W K=10, 500 prior, window 50", "k": 10, "turns": 15, "conversation": "prior-500", "window": 50},
        {"label": "W K=10, 500 prior, window 500", "k": 10, "turns": 10, "conversation": "prior-500", "window": 500},
    ]
    results: dict[str, Any] = {}
    for workload in workloads:
        k = workload["k"]
        turns = max(1, round(workload["turns"] * scale))
        lg_turns = max(1, round(workload.get("lg_turns", 0) * scale)) if "lg_turns" in workload else 0
        ours_rates: list[float] = []
        lg_rates: list[float] = []
        ratios: list[float] = []
        ours_cpu: list[float] = []
        lg_cpu: list[float] = []
        side: dict[str, list[float]] = {"quiet_ms": [], "quiet_cpu": [], "floor_ms": [], "events_cost": [], "floor": []}
        for _ in range(reps):
            gc.collect()
            seconds, cpu = ours_turns(
                runner, k, turns, window=workload.get("window", 50), conversation=workload.get("conversation")
            )
            ours_rates.append(turns * steps_per_turn(k) / seconds)
            ours_cpu.append(cpu * 1000 / (turns * steps_per_turn(k)))
            if workload.get("side"):
                steps = turns * steps_per_turn(k)
                gc.collect()
                quiet_seconds, quiet_cpu = ours_turns(quiet, k, turns)
                side["quiet_ms"].append(quiet_seconds * 1000 / steps)
                side["quiet_cpu"].append(quiet_cpu * 1000 / steps)
                side["events_cost"].append(seconds / quiet_seconds)
                floor_seconds = floor.run(steps)
                side["floor_ms"].append(floor_seconds * 1000 / steps)
                side["floor"].append(seconds / floor_seconds)
            if lg_turns:
                gc.collect()
                lg_seconds, cpu = langgraph_turns(graphs[k], k, lg_turns)
                lg_rates.append(lg_turns * steps_per_turn(k) / lg_seconds)
                lg_cpu.append(cpu * 1000 / (lg_turns * steps_per_turn(k)))
                ratios.append(ours_rates[-1] / lg_rates[-1])
        entry: dict[str, Any] = {
            "k": k,
            "steps_per_turn": steps_per_turn(k),
            "turns_per_rep": turns,
            "ours_steps_per_s": Stat.of(ours_rates).as_dict(),
            "ours_turns_per_s": Stat.of([r / steps_per_turn(k) for r in ours_rates]).as_dict(),
            "ours_cpu_ms_per_step": Stat.of(ours_cpu).as_dict(),
        }
        if side["floor"]:
            entry["ours_ms_per_step"] = Stat.of([1000 / rate for rate in ours_rates]).as_dict()
            entry["without_events_ms_per_step"] = Stat.of(side["quiet_ms"]).as_dict()
            entry["without_events_cpu_ms_per_step"] = Stat.of(side["quiet_cpu"]).as_dict()
            entry["events_on_over_off_time"] = Stat.of(side["events_cost"]).as_dict()
            entry["floor_ms_per_update"] = Stat.of(side["floor_ms"]).as_dict()
            entry["over_floor_time"] = Stat.of(side["floor"]).as_dict()
            entry["floor_row_bytes"] = floor.row_bytes()
        if lg_rates:
            entry["langgraph_turns_per_rep"] = lg_turns
            entry["langgraph_steps_per_s"] = Stat.of(lg_rates).as_dict()
            entry["langgraph_turns_per_s"] = Stat.of([r / steps_per_turn(k) for r in lg_rates]).as_dict()
            entry["langgraph_cpu_ms_per_step"] = Stat.of(lg_cpu).as_dict()
            entry["ratio"] = Stat.of(ratios).as_dict()
        results[workload["label"]] = entry
        log(
            f"  {workload['label']}: ours {entry['ours_steps_per_s']['median']:,.0f} steps/s"
            + (f", LangGraph {entry['langgraph_steps_per_s']['median']:,.0f} steps/s" if lg_rates else "")
        )
    return results


# --- Per-step profiles ----------------------------------------------------------------------------


def ours_profile(runner: AgentRunner, counter: DriverBytes, admin: Any, turn: AgentTurn) -> dict[str, list[float]]:
    """Step a saved READY turn to its end, timing each step and counting its bytes (outside the timing)."""
    rows: dict[str, list[float]] = {"ms": [], "wal": [], "driver": [], "stored": [], "history": []}
    stored = ours_stored_bytes(admin, turn.id)
    while not turn.is_terminal:
        history = len(turn.messages)
        wal_before = wal_position(admin)
        counter.take()
        started = time.perf_counter()
        turn = runner.step(turn).turn
        elapsed = time.perf_counter() - started
        _, sent = counter.take()
        rows["ms"].append(elapsed * 1000)
        rows["wal"].append(wal_position(admin) - wal_before)
        rows["driver"].append(sent)
        now_stored = ours_stored_bytes(admin, turn.id)
        rows["stored"].append(now_stored - stored)
        stored = now_stored
        rows["history"].append(history)
    if turn.status != "COMPLETED":
        raise RuntimeError(f"turn ended {turn.status}")
    return rows


def langgraph_profile(graph: Any, admin: Any) -> tuple[dict[str, list[float]], str]:
    """Time each superstep of a LangGraph W turn (the generator runs only inside `next`)."""
    import langgraph_peer

    config = langgraph_peer.new_thread()
    steps = langgraph_peer.stream_steps(graph, config)
    rows: dict[str, list[float]] = {"ms": [], "wal": [], "history": []}
    while True:
        wal_before = wal_position(admin)
        started = time.perf_counter()
        try:
            next(steps)
        except StopIteration:
            # The run's last checkpoint belongs to the last step.
            rows["ms"][-1] += (time.perf_counter() - started) * 1000
            rows["wal"][-1] += wal_position(admin) - wal_before
            break
        rows["ms"].append((time.perf_counter() - started) * 1000)
        rows["wal"].append(wal_position(admin) - wal_before)
        rows["history"].append(len(rows["ms"]))  # input message + one message per step before this one
    return rows, config["configurable"]["thread_id"]


def ours_stored_bytes(admin: Any, turn_id: str) -> int:
    """Bytes of the rows of one turn: its header, its messages and its events (`pg_column_size`)."""
    row = admin.execute(
        "SELECT (SELECT pg_column_size(t.*) FROM agent_turns t WHERE id = %s)"
        " + (SELECT coalesce(sum(pg_column_size(m.*)), 0) FROM agent_turn_messages m WHERE turn_id = %s)"
        " + (SELECT coalesce(sum(pg_column_size(e.*)), 0) FROM agent_turn_events e WHERE turn_id = %s)",
        (turn_id, turn_id, turn_id),
    ).fetchone()
    return int(row[0])


def _edge_ratio(values: list[float]) -> tuple[float, float, float]:
    start = statistics.median(values[:EDGE])
    end = statistics.median(values[-EDGE:])
    return start, end, end / start if start else float("nan")


def _per_index_median(runs: list[list[float]]) -> list[float]:
    length = min(len(run) for run in runs)
    return [statistics.median(run[i] for run in runs) for i in range(length)]


def long_turn_profile(
    runner: AgentRunner, counter: DriverBytes, saver: Any, admin: Any, reps: int, k: int
) -> dict[str, Any]:
    import langgraph_peer

    graph = langgraph_peer.workload_graph(k, saver)
    agent = w_agent(k)
    ours_runs: list[dict[str, list[float]]] = []
    lg_runs: list[dict[str, list[float]]] = []
    ours_bytes: list[int] = []
    lg_bytes: list[int] = []
    for _ in range(reps):
        gc.collect()
        turn = runner.start(agent, "check my orders")
        ours_runs.append(ours_profile(runner, counter, admin, turn))
        ours_bytes.append(ours_stored_bytes(admin, turn.id))
        gc.collect()
        rows, thread_id = langgraph_profile(graph, admin)
        lg_runs.append(rows)
        lg_bytes.append(langgraph_peer.stored_bytes(saver.conn, thread_id))
    result: dict[str, Any] = {"k": k, "edge_steps": EDGE}
    for name, runs, stored in (("ours", ours_runs, ours_bytes), ("langgraph", lg_runs, lg_bytes)):
        side: dict[str, Any] = {"stored_bytes_per_turn": Stat.of(stored).as_dict()}
        for metric in runs[0]:
            if metric == "history":
                side["history"] = runs[0]["history"]
                continue
            per_rep = [_edge_ratio(run[metric]) for run in runs]
            side[metric] = {
                "start": Stat.of([p[0] for p in per_rep]).as_dict(),
                "end": Stat.of([p[1] for p in per_rep]).as_dict(),
                "end_over_start": Stat.of([p[2] for p in per_rep]).as_dict(),
                "mean": Stat.of([statistics.fmean(run[metric]) for run in runs]).as_dict(),
                "series": _per_index_median([run[metric] for run in runs]),
            }
        result[name] = side
    per_rep_ratio = [
        statistics.fmean(lg["ms"]) / statistics.fmean(ours["ms"]) for ours, lg in zip(ours_runs, lg_runs, strict=True)
    ]
    result["langgraph_over_ours_time"] = Stat.of(per_rep_ratio).as_dict()
    log(
        f"  K={k} per step: ours {result['ours']['ms']['start']['median']:.3f} -> "
        f"{result['ours']['ms']['end']['median']:.3f} ms, LangGraph {result['langgraph']['ms']['start']['median']:.3f}"
        f" -> {result['langgraph']['ms']['end']['median']:.3f} ms"
    )
    return result


def prior_history_profile(runner: AgentRunner, counter: DriverBytes, admin: Any, reps: int) -> dict[str, Any]:
    """Per-step cost of K=10 turns in a conversation with 500 earlier messages, against a fresh one."""
    memory = runner.chat_memory_provider("profile-500")  # type: ignore[misc]
    memory.append(prior_messages(500, "p"))
    cases = {
        "fresh conversation": (50, None),
        "500 prior, window 50": (50, "profile-500"),
        "500 prior, window 500": (500, "profile-500"),
    }
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in cases}
    for _ in range(reps):
        for label, (window, conversation) in cases.items():
            gc.collect()
            conversation_id = conversation or f"fresh-{uuid.uuid4().hex}"
            agent = w_agent(10, window=window)
            wal_before = wal_position(admin)
            counter.take()
            started = time.perf_counter()
            turn = runner.start(agent, "check my orders", conversation_id=conversation_id)
            create_ms = (time.perf_counter() - started) * 1000
            create_wal = wal_position(admin) - wal_before
            _, create_sent = counter.take()
            rows = ours_profile(runner, counter, admin, turn)
            runs[label].append(
                {
                    "attached": len(turn.messages) - 1,
                    "create_ms": create_ms,
                    "create_wal": create_wal,
                    "create_driver": create_sent,
                    "ms": statistics.median(rows["ms"]),
                    "wal": statistics.median(rows["wal"]),
                    "driver": statistics.median(rows["driver"]),
                    "turn_ms": create_ms + sum(rows["ms"]),
                }
            )
    result: dict[str, Any] = {}
    fresh = runs["fresh conversation"]
    for label, measured in runs.items():
        entry: dict[str, Any] = {"attached_messages": measured[0]["attached"]}
        for metric in ("create_ms", "create_wal", "create_driver", "ms", "wal", "driver", "turn_ms"):
            entry[metric] = Stat.of([m[metric] for m in measured]).as_dict()
        for metric in ("ms", "wal", "driver"):
            entry[f"{metric}_vs_fresh"] = Stat.of(
                [m[metric] / f[metric] for m, f in zip(measured, fresh, strict=True)]
            ).as_dict()
        result[label] = entry
        log(f"  {label}: {entry['ms']['median']:.3f} ms/step, create {entry['create_ms']['median']:.1f} ms")
    return result


def hot_updates(turns: int) -> dict[str, Any]:
    """Run `turns` W K=10 turns in a schema of their own; how many of their header updates were HOT."""
    with pg_schema("bench_hot") as (url, schema), psycopg.connect(libpq(url), autocommit=True) as admin:
        engine = store.make_engine(url)
        runner = make_runner(engine)
        ours_turns(runner, 10, turns)
        runner.turn_store.close()  # type: ignore[attr-defined]
        engine.dispose()  # a backend reports its counters when it exits
        expected = turns * (steps_per_turn(10) + 1)  # every step, and the save that takes a READY turn
        deadline = time.monotonic() + 30
        while True:
            row = admin.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE schemaname = %s AND relname = 'agent_turns'",
                [schema],
            ).fetchone()
            if (row is not None and row[0] >= expected) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    updates, hot = (int(row[0]), int(row[1])) if row is not None else (0, 0)
    log(f"  HOT updates: {hot} of {updates}")
    return {
        "turns": turns,
        "updates": updates,
        "hot_updates": hot,
        # READY -> RUNNING and RUNNING -> COMPLETED change the (indexed) status: at most the rest can be HOT.
        "status_changes": 2 * turns,
    }


def main() -> None:
    args = arguments(__doc__)
    reps = 3 if args.quick else 9
    profile_reps = 3 if args.quick else 5
    scale = 0.5 if args.quick else 1.0
    import langgraph_peer

    with pg_schema("bench") as (url, schema), psycopg.connect(libpq(url), autocommit=True) as admin:
        engine = store.make_engine(url)
        counter = DriverBytes(engine)
        runner = make_runner(engine)
        quiet = make_runner(engine, events=False)
        ours_turns(runner, 10, 3)
        floor = Floor(libpq(url), header_row_bytes(admin))
        with langgraph_peer.postgres_saver(libpq(url)) as saver:
            log("durable: throughput")
            results: dict[str, Any] = {
                "schema": schema,
                "throughput": throughput(runner, quiet, floor, saver, reps, scale),
            }
            log("durable: K=200 per-step profile")
            results["long_turn"] = long_turn_profile(
                runner, counter, saver, admin, profile_reps, 50 if args.quick else 200
            )
            log("durable: 500 prior messages")
            results["prior_history"] = prior_history_profile(runner, counter, admin, profile_reps)
        floor.close()
        engine.dispose()
    log("durable: HOT updates")
    results["hot"] = hot_updates(10 if args.quick else 30)
    write_results(args.json, results)
    print_summary(results)


def print_summary(results: dict[str, Any]) -> None:
    print("| workload | ours steps/s | LangGraph steps/s | ours / LangGraph |")
    print("|---|---|---|---|")
    for label, entry in results["throughput"].items():
        lg = entry.get("langgraph_steps_per_s")
        ratio = entry.get("ratio")
        print(
            f"| {label} | {entry['ours_steps_per_s']['median']:,.0f} | {lg['median'] if lg else float('nan'):,.0f} "
            f"| {ratio['median'] if ratio else float('nan'):.2f}x |"
        )
    k10 = results["throughput"]["W K=10"]
    print(
        f"W K=10: {k10['ours_ms_per_step']['median']:.3f} ms/step; event log off "
        f"{k10['without_events_ms_per_step']['median']:.3f} ms/step (on / off "
        f"{k10['events_on_over_off_time']['median']:.2f}x); floor {k10['floor_ms_per_update']['median']:.3f} ms "
        f"per update of a {k10['floor_row_bytes']} B row (ours / floor {k10['over_floor_time']['median']:.2f}x)"
    )
    hot = results["hot"]
    print(f"HOT updates: {hot['hot_updates']} of {hot['updates']} ({hot['status_changes']} changed the status)")
    long_turn = results["long_turn"]
    for side in ("ours", "langgraph"):
        ms = long_turn[side]["ms"]
        print(
            f"{side}: K={long_turn['k']} per-step start {ms['start']['median']:.3f} ms, end {ms['end']['median']:.3f} ms"
            f" ({ms['end_over_start']['median']:.2f}x)"
        )


if __name__ == "__main__":
    main()
