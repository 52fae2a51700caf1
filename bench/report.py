"""Render the collected results as docs/benchmarks.md and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PLOT_HISTORY = "bench_per_step_history.png"
PLOT_RATES = "bench_steps_per_second.png"
PLOT_RESUME = "bench_resume_latency.png"
PLOT_MEMORY = "bench_memory.png"


# --- Formatting -----------------------------------------------------------------------------------


def _num(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def spread(stat: dict[str, float] | None, digits: int = 0, unit: str = "") -> str:
    """`median (min-max)` of a repeated measurement."""
    if not stat:
        return "-"
    return f"{_num(stat['median'], digits)}{unit} ({_num(stat['min'], digits)}-{_num(stat['max'], digits)})"


def times(stat: dict[str, float] | None) -> str:
    if not stat:
        return "-"
    return f"**{stat['median']:.2f}x** ({stat['min']:.2f}-{stat['max']:.2f})"


def size(value: float) -> str:
    for unit, scale in (("MB", 2**20), ("KB", 2**10)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f} B"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --- Goals ----------------------------------------------------------------------------------------


@dataclass
class Goal:
    name: str
    target: str
    measured: str
    met: bool | None


def _get(data: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def goals(sections: dict[str, Any]) -> list[Goal]:
    found: list[Goal] = []
    durable = sections.get("durable")
    ratio = _get(durable or {}, "throughput", "W K=10", "ratio")
    ratio200 = _get(durable or {}, "throughput", "W K=200", "ratio")
    found.append(
        Goal(
            "Durable PostgreSQL path vs LangGraph + PostgresSaver (durability sync), steps/s on W",
            ">= 4x",
            (f"{ratio['median']:.2f}x at K=10" if ratio else "not measured")
            + (f"; {ratio200['median']:.2f}x at K=200" if ratio200 else ""),
            None if ratio is None else ratio["median"] >= 4,
        )
    )
    floor = _get(durable or {}, "throughput", "W K=10", "over_floor_time")
    floor_ms = _get(durable or {}, "throughput", "W K=10", "floor_ms_per_update")
    found.append(
        Goal(
            "Durable PostgreSQL step on W K=10 vs the floor (one autocommitted compare-and-swap UPDATE of a row "
            "of the same size, raw psycopg)",
            "<= 2x",
            f"{floor['median']:.2f}x (floor {floor_ms['median']:.3f} ms)" if floor and floor_ms else "not measured",
            None if floor is None else floor["median"] <= 2,
        )
    )
    events = _get(durable or {}, "throughput", "W K=10", "events_on_over_off_time")
    found.append(
        Goal(
            "Durable step on W K=10 with the event log on vs off",
            "<= 1.10x",
            f"{events['median']:.2f}x" if events else "not measured",
            None if events is None else events["median"] <= 1.10,
        )
    )
    long_turn = _get(durable or {}, "long_turn", "ours")
    if long_turn:
        k = durable["long_turn"]["k"]
        metrics = [m for m in ("ms", "wal", "stored", "driver") if m in long_turn]
        worst = max(long_turn[m]["end_over_start"]["median"] for m in metrics)
        names = {"ms": "time", "wal": "WAL bytes", "stored": "stored bytes", "driver": "parameter bytes"}
        found.append(
            Goal(
                f"Per-step time and bytes (events on) flat in history: end of a K={k} turn vs its start",
                "<= 1.2x",
                ", ".join(f"{names[m]} {long_turn[m]['end_over_start']['median']:.2f}x" for m in metrics),
                worst <= 1.2,
            )
        )
    else:
        found.append(Goal("Per-step time and bytes flat in history", "<= 1.2x", "not measured", None))
    memory_rate = _get(sections, "step_overhead", "workloads", "W K=10", "steps_per_s")
    found.append(
        Goal(
            "In-memory engine, steps/s on W (K=10)",
            ">= 3,000",
            f"{memory_rate['median']:,.0f} steps/s" if memory_rate else "not measured",
            None if memory_rate is None else memory_rate["median"] >= 3000,
        )
    )
    pools = _get(sections, "celery_bench", "pools") or {}
    for concurrency in ("1", "2"):
        entry = _get(pools, concurrency, "throughput", "W K=10", "ratio")
        found.append(
            Goal(
                f"Celery path vs raw Celery chain, W K=10, {concurrency} worker process(es)",
                ">= 1.0x hops/s",
                f"{entry['median']:.2f}x" if entry else "not measured",
                None if entry is None else entry["median"] >= 1.0,
            )
        )
    for name, label in (("ours-in-process", "in-process lease"), ("ours-sql", "SQL lease")):
        p50 = _get(sections, "resume", name, "p50")
        found.append(
            Goal(
                f"Resume to completion, in-process AgentWorker on PostgreSQL ({label}), p50",
                "<= 3 ms",
                f"{p50['median']:.2f} ms" if p50 else "not measured",
                None if p50 is None else p50["median"] <= 3,
            )
        )
    celery_p50 = _get(pools, "1", "resume", "p50")
    found.append(
        Goal(
            "Resume to completion through Celery, p50",
            "<= 15 ms",
            f"{celery_p50['median']:.2f} ms" if celery_p50 else "not measured",
            None if celery_p50 is None else celery_p50["median"] <= 15,
        )
    )
    memory = sections.get("memory")
    found.append(
        Goal(
            f"Worker RSS growth over {memory['turns']:,} turns" if memory else "Worker RSS growth over 5,000 turns",
            "< 10%",
            f"{memory['growth_percent']:+.1f}%" if memory else "not measured",
            None if memory is None else memory["growth_percent"] < 10,
        )
    )
    cli = sections.get("cli_startup")
    for key, label, limit in (("help", "`agent-runner --help`", 0.3), ("turns_list", "`agent-runner turns list`", 1.0)):
        figure = _get(cli or {}, key, "median")
        found.append(
            Goal(
                f"{label} start-up, wall clock (median of fresh processes)",
                f"<= {limit:g} s",
                "not measured" if figure is None else f"{figure:.2f} s (bare python {cli['python']['median']:.2f} s)",
                None if figure is None else figure <= limit,
            )
        )
    import admission
    import mcp_overhead
    import model_limits
    import model_overhead

    found += [Goal(*goal) for goal in model_limits.goals(sections.get("model_limits"))]
    found += [Goal(*goal) for goal in admission.goals(sections.get("admission"))]
    found += [Goal(*goal) for goal in model_overhead.goals(sections.get("model_overhead"))]
    found += [Goal(*goal) for goal in mcp_overhead.goals(sections.get("mcp_overhead"))]
    return found


# --- Sections -------------------------------------------------------------------------------------


def machine_section(everything: dict[str, Any]) -> str:
    facts = everything["machine"]
    packages = ", ".join(f"{name} {version}" for name, version in facts["packages"].items())
    pg = facts.get("postgresql_settings", {})
    rows = [
        ["Run", f"{everything['started']}, {'quick smoke run' if everything['quick'] else 'full run'}"],
        ["CPU", f"{facts['cpu_model']}, {facts['logical_cores']} logical cores ({facts['physical_cores']} physical)"],
        ["Memory", f"{facts['memory_gb']} GB"],
        ["OS", facts["os"]],
        ["Python", facts["python"]],
        ["Packages", packages],
        [
            "PostgreSQL",
            f"{facts.get('postgresql')} on the same machine, "
            + ", ".join(f"{name}={value}" for name, value in pg.items()),
        ],
        ["Redis", f"{facts.get('redis')} on the same machine (broker, leases, guard)"],
    ]
    loads = [
        f"{name} {section['_load'][0]:.1f} -> {section['_load'][1]:.1f}"
        for name, section in everything["sections"].items()
        if "_load" in section
    ]
    if loads:
        rows.append(["1-minute load average (before -> after each section)", ", ".join(loads)])
    return table(["", ""], rows)


def in_memory_section(data: dict[str, Any]) -> str:
    rows = [
        [
            label,
            spread(entry["steps_per_s"]),
            spread(entry["turns_per_s"], 1),
            f"{entry['us_per_step']['median']:.0f}",
            times(entry["runner_over_bare_time"]),
        ]
        for label, entry in data["workloads"].items()
    ]
    base = data["baseline_steps_per_s"]
    flat = data["workloads"]["W K=10, 500 prior (explicit)"]["time_vs_10_prior"]
    conversation = data["workloads"]["W K=10, 500 prior (conversation, window 500)"]["time_vs_10_prior"]
    return "\n\n".join(
        [
            "`InMemoryAgentTurnStore`, `runner.run` in one thread, every step through the state machine and a "
            "snapshot save (the in-memory store keeps immutable snapshots). Baseline in the same run: the scripted "
            f"model and the tool called directly, no runner: {spread(base)} steps/s.",
            table(["workload", "steps/s", "turns/s", "us/step", "time vs no runner"], rows),
            f"Per-step time with 500 prior messages against 10: {times(flat)} with explicit history, "
            f"{times(conversation)} in a conversation. The extra cost is the copy of the attached window into the "
            "new turn (validated once per turn) and the longer message list each immutable snapshot copies.",
        ]
    )


def _projection_cost(data: dict[str, Any]) -> str:
    plain = _get(data, "throughput", "W K=10", "ours_steps_per_s")
    fresh = _get(data, "throughput", "W K=10, fresh conversation", "ours_steps_per_s")
    if not plain or not fresh:
        return ""
    return (
        f" In a conversation a step costs {plain['median'] / fresh['median']:.1f}x as much: the same statement also "
        "appends the new messages to the chat memory (the sequence counter upsert and the message insert) and "
        "bumps the conversation's event position, so the server writes and logs more before the commit."
    )


def durable_section(data: dict[str, Any]) -> str:
    rows = [
        [
            label,
            str(entry["turns_per_rep"]),
            spread(entry["ours_steps_per_s"]),
            spread(entry["ours_turns_per_s"], 1),
            f"{1000 / entry['ours_steps_per_s']['median']:.3f}",
            f"{entry['ours_cpu_ms_per_step']['median']:.3f}" if "ours_cpu_ms_per_step" in entry else "-",
        ]
        for label, entry in data["throughput"].items()
    ]
    long_turn = data["long_turn"]
    ours = long_turn["ours"]
    k = long_turn["k"]
    edge = long_turn["edge_steps"]
    k10 = data["throughput"]["W K=10"]
    hot = data.get("hot")
    step_rows = []
    if "floor_ms_per_update" in k10:
        step_rows = [
            [
                "ours, event log on",
                spread(k10["ours_ms_per_step"], 3),
                f"{k10['ours_cpu_ms_per_step']['median']:.3f}",
                "1.00x",
                times(k10["over_floor_time"]),
            ],
            [
                "ours, event log off (the store is handed no events)",
                spread(k10["without_events_ms_per_step"], 3),
                f"{k10['without_events_cpu_ms_per_step']['median']:.3f}",
                f"on / off {times(k10['events_on_over_off_time'])}",
                "",
            ],
            [
                f"floor: one autocommitted compare-and-swap UPDATE of a {k10['floor_row_bytes']} B row "
                "(raw psycopg, prepared)",
                spread(k10["floor_ms_per_update"], 3),
                "",
                "",
                "1.00x",
            ],
        ]
    flat_rows = [
        [
            "time per step (ms)",
            spread(ours["ms"]["start"], 3),
            spread(ours["ms"]["end"], 3),
            times(ours["ms"]["end_over_start"]),
        ],
        [
            "WAL bytes per step",
            spread(ours["wal"]["start"]),
            spread(ours["wal"]["end"]),
            times(ours["wal"]["end_over_start"]),
        ],
        [
            "bytes stored per step (header growth, message and event rows)",
            spread(ours["stored"]["start"]) if "stored" in ours else "-",
            spread(ours["stored"]["end"]) if "stored" in ours else "-",
            times(ours["stored"]["end_over_start"]) if "stored" in ours else "-",
        ],
        [
            "parameter bytes handed to the driver per step",
            spread(ours["driver"]["start"]),
            spread(ours["driver"]["end"]),
            times(ours["driver"]["end_over_start"]),
        ],
    ]
    prior_rows = []
    for label, entry in data["prior_history"].items():
        prior_rows.append(
            [
                label,
                str(entry["attached_messages"]),
                spread(entry["ms"], 3),
                times(entry["ms_vs_fresh"]),
                spread(entry["wal"]),
                spread(entry["driver"]),
                f"{spread(entry['create_ms'], 1)} / {size(entry['create_wal']['median'])}",
            ]
        )
    parts = [
        "`SqlAgentTurnStore` (and `SqlChatMemoryProvider` for conversations) on one engine, `runner.run` in one "
        "thread, the event log on: the READY snapshot, then one compare-and-swap save per step (header UPDATE, "
        "new-message INSERT and event INSERT as one autocommitted statement, prepared on the driver), plus the save "
        "that takes the READY turn (TURN_RUNNING). In a conversation the same statement also projects the new "
        "messages into the chat memory.",
        table(["workload", "turns per rep", "steps/s", "turns/s", "ms/step", "CPU ms/step (this process)"], rows),
        "The difference between ms/step and CPU ms/step is time spent waiting for PostgreSQL (one round trip "
        "and one commit per step; the server runs on the same 2 cores)." + _projection_cost(data),
        "Where the CPU of a step goes (runner, JSON, driver), with a flame graph: [profile.md](profile.md), made by "
        "`python bench/profile_step.py`.",
    ]
    if step_rows:
        parts += [
            "**W K=10 against the floor and without the event log**, in the same repetitions (ratios per "
            "repetition; the floor runs as many updates as the turns take steps):",
            table(["", "ms per step (update)", "CPU ms/step", "events", "over the floor"], step_rows),
        ]
    if hot:
        parts.append(
            f"**HOT updates**: of the {hot['updates']:,} header updates of {hot['turns']} W K=10 turns in a schema of "
            f"their own, {hot['hot_updates']:,} were HOT (`pg_stat_user_tables.n_tup_hot_upd`); "
            f"{hot['status_changes']:,} changed the indexed status (READY to RUNNING, RUNNING to COMPLETED) and "
            "cannot be. A HOT update writes the new row version on the same page and touches no index; it needs "
            "room on the page (the table's fillfactor is 75) and old versions pruned, which a long transaction "
            "elsewhere on the server can hold back."
        )
    return "\n\n".join(
        parts
        + [
            f"**Start and end of a K={k} turn** ({2 * k + 1} steps, event log on; median of the first and of the last "
            f"{edge} steps in each repetition; WAL bytes are the server's, read outside the timed step, so other "
            "activity on the server adds to them; stored bytes are `pg_column_size` of the turn's rows after the "
            "step minus before; parameter bytes are what the store hands to psycopg):",
            table(["", f"first {edge} steps", f"last {edge} steps", "end / start"], flat_rows),
            f"Stored for the whole K={k} turn (header, messages and events): "
            f"{size(ours['stored_bytes_per_turn']['median'])}.",
            "**A K=10 turn in a conversation that already holds 500 messages** (`SqlChatMemoryProvider`; the window "
            "`max_attached_messages` decides how many are copied into the turn), against a fresh conversation. "
            "Per-step figures are medians over the turn's 21 steps; the last column is the creation of the turn "
            "(reading the window, saving the READY snapshot with the attached messages, projecting the user message).",
            table(
                [
                    "conversation",
                    "attached",
                    "ms/step",
                    "vs fresh",
                    "WAL B/step",
                    "parameter B/step",
                    "create: ms / WAL",
                ],
                prior_rows,
            ),
        ]
    )


def store_growth_section(data: dict[str, Any]) -> str:
    rows = []
    base = data["sql_store"]["10"]
    for length, entry in data["sql_store"].items():
        whole = data["whole_snapshot"].get(length)
        rows.append(
            [
                length,
                f"{entry['save_ms']:.3f}",
                f"{entry['save_ms'] / base['save_ms']:.2f}x",
                f"{entry['payload_bytes']:,.0f}",
                f"{entry['wal_bytes']:,.0f}",
                f"{entry['transactions']:.2f}",
                f"{whole['save_ms']:.3f} / {whole['wal_bytes']:,.0f}" if whole else "-",
            ]
        )
    return "\n\n".join(
        [
            f"`SqlAgentTurnStore.save` alone (`bench/store_growth.py`): a turn with a history of N messages takes "
            f"{data['steps']} steps that each add one message and change the header; median of {data['runs']} runs. "
            "Reference in the same run: the same steps saved as one row holding the whole snapshot as JSON, what "
            f"an append-only message table avoids. The floor, a transaction inserting one small row through SQLAlchemy "
            f"(BEGIN, INSERT, COMMIT), takes {data['floor_ms']:.3f} ms here.",
            table(
                [
                    "history",
                    "save ms",
                    "vs 10",
                    "bytes sent",
                    "WAL bytes",
                    "transactions",
                    "whole-snapshot row: save ms / WAL bytes",
                ],
                rows,
            ),
        ]
    )


def celery_section(data: dict[str, Any]) -> str:
    rows = []
    for key, pool in data["pools"].items():
        for label, entry in pool["throughput"].items():
            cpu = entry.get("cpu", {})
            rows.append(
                [
                    f"{pool.get('processes', key)} / {pool.get('steps_per_task', data['steps_per_task'])}",
                    label,
                    str(entry["turns"]),
                    spread(entry["runner_steps_per_s"]),
                    spread(entry["runner_turns_per_s"], 1),
                    spread(entry["raw_hops_per_s"]),
                    times(entry["ratio"]),
                    f"{cpu['runner']['worker_ms_per_step']['median']:.2f} / {cpu['raw']['worker_ms_per_step']['median']:.2f}"
                    if cpu
                    else "-",
                    f"{cpu['runner']['machine_busy']['median'] * 100:.0f}%" if cpu else "-",
                ]
            )
    return "\n\n".join(
        [
            "Real `celery worker` processes (prefork pool), PostgreSQL store, Redis broker, lease and guard. "
            f"`AGENT_RUNNER_STEPS_PER_TASK` is {data['steps_per_task']} (the default) unless the pool column says "
            "otherwise. The raw chain runs in its own worker with the same Celery settings "
            "(`workers.celery_app.config.celery_config`: JSON, `task_acks_late`, reject on worker lost, prefetch 1) on the same "
            "broker: as many chains as turns, 2K+1 hops each, one hop per step the runner takes. Repetitions "
            "alternate between the two. Ratio: runner steps/s over raw hops/s. Worker CPU: user+system CPU of the "
            "worker's processes per step (per hop for the raw chain); machine busy: all CPUs, during the runner's "
            "repetitions (PostgreSQL and Redis run on the same 2 cores).",
            table(
                [
                    "processes / steps per task",
                    "workload",
                    "turns",
                    "runner steps/s",
                    "runner turns/s",
                    "raw chain hops/s",
                    "runner / raw",
                    "worker CPU ms/step: runner / raw",
                    "machine busy",
                ],
                rows,
            ),
        ]
    )


def resume_section(resume: dict[str, Any] | None, celery: dict[str, Any] | None) -> str:
    rows = []
    labels = {
        "ours-in-process": "ours: AgentWorker, in-process lease, PostgreSQL store",
        "ours-sql": "ours: AgentWorker, SqlTurnLease, PostgreSQL store",
        "langgraph": "LangGraph: Command(resume=...) on a fresh graph, PostgresSaver",
    }
    if resume:
        for name, label in labels.items():
            entry = resume[name]
            rows.append([label, spread(entry["p50"], 2), spread(entry["p99"], 2), str(entry["pooled"]["n"])])
    celery_resume = _get(celery or {}, "pools", "1", "resume")
    if celery_resume:
        rows.append(
            [
                "ours: Celery, 1 worker process, Redis lease, PostgreSQL store",
                spread(celery_resume["p50"], 2),
                spread(celery_resume["p99"], 2),
                str(celery_resume["pooled"]["n"]),
            ]
        )
    text = [
        "A turn waits for approval of its one tool call. The clock starts before `submit_resume(turn_id, "
        "approve_tool(call_id))` and stops when the COMPLETED snapshot is saved: the resume's save, the worker's "
        "pick-up (lease, load), the tool step and the final model step. In-process: the runner's dispatch hands the "
        "turn to a worker thread (no poll of the store) and the completion is the TURN_COMPLETED event. Celery: "
        "`submit_resume` sends a "
        "`step_turn` message and the completion is a `pg_notify` from a trigger on the COMPLETED update, received at "
        "commit. Values in ms, median of 3 repetitions (min-max) of each repetition's p50 and p99.",
        table(["path", "p50 ms", "p99 ms", "samples"], rows),
    ]
    if resume:
        text.append(f"LangGraph p50 over ours (SQL lease): {times(resume['langgraph_over_ours_p50'])}.")
    return "\n\n".join(text)


def peers_section(durable: dict[str, Any] | None, resume: dict[str, Any] | None) -> str:
    parts = [
        "LangGraph with the same scripted workload: a model node (a `BaseChatModel` subclass emitting the same tool "
        "calls) and a `ToolNode` over `MessagesState`, checkpointed by `PostgresSaver` on the same server, "
        '`durability="sync"`, one node per superstep, so a W(K) run takes the same 2K+1 steps. Runs are interleaved '
        "with ours in the same process; ratios are per repetition."
    ]
    if durable:
        rows = [
            [
                label,
                spread(entry["ours_steps_per_s"]),
                spread(entry["langgraph_steps_per_s"]),
                times(entry["ratio"]),
                f"{entry['ours_cpu_ms_per_step']['median']:.3f} / {entry['langgraph_cpu_ms_per_step']['median']:.3f}"
                if "langgraph_cpu_ms_per_step" in entry
                else "-",
            ]
            for label, entry in durable["throughput"].items()
            if "ratio" in entry
        ]
        parts.append(
            table(
                ["workload", "ours steps/s", "LangGraph steps/s", "ours / LangGraph", "CPU ms/step: ours / LangGraph"],
                rows,
            )
        )
        long_turn = durable["long_turn"]
        k = long_turn["k"]
        edge = long_turn["edge_steps"]
        per_step = []
        for name, label in (("ours", "ours"), ("langgraph", "LangGraph")):
            side = long_turn[name]
            per_step.append(
                [
                    label,
                    spread(side["ms"]["start"], 3),
                    spread(side["ms"]["end"], 3),
                    times(side["ms"]["end_over_start"]),
                    f"{size(side['wal']['start']['median'])} -> {size(side['wal']['end']['median'])}",
                    size(side["stored_bytes_per_turn"]["median"]),
                ]
            )
        parts.append(
            f"Along one K={k} turn (first and last {edge} steps; stored bytes = rows of that turn, `pg_column_size`):"
        )
        parts.append(
            table(
                ["", "ms/step, start", "ms/step, end", "end / start", "WAL per step, start -> end", "stored per turn"],
                per_step,
            )
        )
        parts.append(
            f"Mean time per step over the whole K={k} turn, LangGraph over ours: "
            f"{times(long_turn['langgraph_over_ours_time'])}."
        )
    if resume:
        parts.append(
            "Interrupt and resume: the graph's `approval` node calls `interrupt()` before the `ToolNode`; a graph "
            "compiled separately, on its own connection, resumes with `Command(resume=...)` to the end "
            f"(p50 {resume['langgraph']['p50']['median']:.2f} ms, p99 {resume['langgraph']['p99']['median']:.2f} ms; "
            f"ours, SQL lease: p50 {resume['ours-sql']['p50']['median']:.2f} ms): LangGraph over ours "
            f"{times(resume['langgraph_over_ours_p50'])}. See section 4."
        )
    return "\n\n".join(parts)


def memory_section(data: dict[str, Any]) -> str:
    return (
        f"{data['store']}; {data['workload']}. After {data['warmup_turns']} warm-up turns and a garbage collection: "
        f"**{data['rss_before_mb']:.1f} MB**; after {data['turns']:,} more turns and a garbage collection: "
        f"**{data['rss_after_mb']:.1f} MB** ({data['growth_percent']:+.1f}%). The worker ran "
        f"{data['turns_per_s']:.0f} turns/s on SQLite meanwhile."
    )


def cli_section(data: dict[str, Any]) -> str:
    rows = [
        [name, f"{data[key]['median']:.3f} s ({data[key]['min']:.3f}-{data[key]['max']:.3f})"]
        for key, name in (
            ("python", "bare `python -c pass`"),
            ("help", "`agent-runner --help`"),
            ("turns_list", "`agent-runner turns list` (SQLite, 20 turns)"),
        )
    ]
    heavy = sorted(set(data["help_packages"]) & {"celery", "sqlalchemy", "fastapi", "openai", "pydantic"})
    return (
        f"Each command run {data['runs']} times as a fresh process, interleaved; median (min-max).\n\n"
        + table(["command", "wall clock"], rows)
        + f"\n\n`--help` loads {', '.join(heavy) if heavy else 'none of Celery, SQLAlchemy, FastAPI, OpenAI, pydantic'}."
    )


def api_section(data: dict[str, Any]) -> str:
    api, bare = data["api"], data["bare"]
    rows = [
        [
            "`POST /v1/turns` (`agent-runner serve --worker celery`): saved and enqueued",
            spread(api["requests_per_s"]),
            spread(api["p50"], 1),
            spread(api["p99"], 1),
            str(api["failures"]),
        ],
        [
            "bare FastAPI `POST`: pydantic body, one INSERT",
            spread(bare["requests_per_s"]),
            spread(bare["p50"], 1),
            spread(bare["p99"], 1),
            str(bare["failures"]),
        ],
    ]
    enqueued = data.get("enqueued")
    answered = data.get("answered")
    check = (
        f" The run's Celery queue held {enqueued:,} step messages afterwards, one per answered start ({answered:,})."
        if enqueued is not None and answered is not None
        else ""
    )
    return (
        f"{data['clients']} client threads with keep-alive connections send the same body for "
        f"{data['seconds_per_run']:g} s to one server, then to the other, {api['requests_per_s']['n']} times; both "
        "servers are one uvicorn process each, on the same PostgreSQL. Starting a turn validates the request, checks "
        "the agent, saves the READY turn with its first message and event, and sends its first step to the Redis "
        "broker (no worker consumes the queue here, so only the API's own cost is measured)."
        + check
        + "\n\n"
        + table(["endpoint", "requests/s", "p50 ms", "p99 ms", "failed"], rows)
        + f"\n\nStarting a turn runs at {times(data['ratio_requests_per_s'])} the requests/s of the bare INSERT "
        "(ratio per repetition). The clients run on the same cores as the servers and the database."
    )


def sse_section(data: dict[str, Any]) -> str:
    mb = 2**20
    followers = data["followers"]
    per_follower = (data["server_rss_peak_bytes"] - data["server_rss_idle_bytes"]) / followers
    rows = [
        ["events received (all followers)", f"{data['events_received']:,}"],
        [
            "delivery latency, every event: p50 / p90 / p99",
            f"{data['all']['p50']:.1f} / {data['all']['p90']:.1f} / **{data['all']['p99']:.1f} ms**",
        ],
        ["deltas (MODEL_DELTA): p50 / p99", f"{data['deltas']['p50']:.1f} / {data['deltas']['p99']:.1f} ms"],
        [
            "durable events (save included): p50 / p99",
            f"{data['durable']['p50']:.1f} / {data['durable']['p99']:.1f} ms",
        ],
        [
            "server RSS: before the followers / connected / peak",
            f"{data['server_rss_idle_bytes'] / mb:.0f} / {data['server_rss_connected_bytes'] / mb:.0f} / "
            f"**{data['server_rss_peak_bytes'] / mb:.0f} MB** ({size(max(per_follower, 0))} per follower)",
        ],
        [
            "server threads: before the followers / peak",
            f"{data['server_threads_idle']} / {data['server_threads_peak']}",
        ],
        [
            "server CPU while streaming",
            f"{data['server_cpu_s']:.2f} s over {data['streaming_s']:.1f} s "
            f"({data['server_cpu_ms_per_1000_events']:.0f} ms per 1,000 events delivered)",
        ],
        ["followers connected in", f"{data['connect_s']:.1f} s"],
    ]
    return (
        f"{followers} clients follow one conversation (`GET /v1/conversations/{{id}}/events`) through a real "
        "`agent-runner serve --worker celery` process on PostgreSQL and Redis, as behind Celery workers; the "
        f"clients run in {data.get('processes', 2)} processes of their own. A runner with a worker's wiring (SQL store, "
        f"chat memory, Redis live channel through the background publisher) runs {data['turns']} turn(s) whose model "
        f"streams {data['deltas_per_turn']} deltas, one every {data['interval_s'] * 1000:g} ms. Latency: the "
        "client's clock when the event arrived minus the event's `timestamp` (set when the runner creates it: for a "
        "delta just before it is published, for a durable event before the save that writes it). One machine, one "
        "clock; the clients, the server, the runner, PostgreSQL and Redis share its cores.\n\n" + table(["", ""], rows)
    )


# --- Plots ----------------------------------------------------------------------------------------


def _rolling_median(values: list[float], window: int = 9) -> list[float]:
    half = window // 2
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def plot_history(durable: dict[str, Any], path: Path) -> None:
    long_turn = durable["long_turn"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for name, label, color in (
        ("ours", "agent-runner (SqlAgentTurnStore)", "tab:blue"),
        ("langgraph", "LangGraph (PostgresSaver, sync)", "tab:orange"),
    ):
        side = long_turn[name]
        history = side["history"][: len(side["ms"]["series"])]
        top.plot(history, side["ms"]["series"], ".", color=color, alpha=0.2, markersize=3)
        top.plot(history, _rolling_median(side["ms"]["series"]), color=color, label=label)
        bottom.plot(history, _rolling_median(side["wal"]["series"]), color=color, label=label)
    top.set_ylabel("ms per step")
    top.set_ylim(bottom=0)
    top.set_title(f"Per-step cost along one K={long_turn['k']} turn (PostgreSQL, every step saved)")
    top.legend()
    top.grid(alpha=0.3)
    bottom.set_ylabel("WAL bytes per step")
    bottom.set_xlabel("messages in the turn's history before the step")
    bottom.set_yscale("log")
    bottom.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rates(sections: dict[str, Any], path: Path) -> None:
    bars: list[tuple[str, dict[str, float], str]] = []
    memory = _get(sections, "step_overhead", "workloads")
    if memory:
        for label in ("W K=10", "W K=200"):
            bars.append((f"in-memory, {label}", memory[label]["steps_per_s"], "tab:green"))
    durable = _get(sections, "durable", "throughput")
    if durable:
        for label in ("W K=10", "W K=200"):
            bars.append((f"PostgreSQL, one process, {label}", durable[label]["ours_steps_per_s"], "tab:blue"))
            bars.append((f"LangGraph + PostgresSaver, {label}", durable[label]["langgraph_steps_per_s"], "tab:orange"))
        bars.append(
            (
                "PostgreSQL, conversation 500 prior, window 500",
                durable["W K=10, 500 prior, window 500"]["ours_steps_per_s"],
                "tab:blue",
            )
        )
    pools = _get(sections, "celery_bench", "pools") or {}
    for key, pool in pools.items():
        entry = pool["throughput"]["W K=10"]
        processes = pool.get("processes", key)
        per_task = pool.get("steps_per_task", "?")
        bars.append(
            (f"Celery, {processes} proc., {per_task} steps/task, W K=10", entry["runner_steps_per_s"], "tab:purple")
        )
        bars.append((f"raw Celery chain, {processes} proc. (hops/s)", entry["raw_hops_per_s"], "tab:gray"))
    if not bars:
        return
    fig, axis = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.2))
    labels = [b[0] for b in bars]
    medians = [b[1]["median"] for b in bars]
    errors = [[b[1]["median"] - b[1]["min"] for b in bars], [b[1]["max"] - b[1]["median"] for b in bars]]
    positions = list(range(len(bars)))[::-1]
    axis.barh(positions, medians, xerr=errors, color=[b[2] for b in bars], capsize=3)
    axis.set_yticks(positions, labels)
    axis.set_xscale("log")
    axis.set_xlabel("steps per second (log scale; median, whiskers min-max)")
    for position, bar in zip(positions, bars, strict=True):
        axis.text(bar[1]["max"] * 1.1, position, f"{bar[1]['median']:,.0f}", va="center", fontsize=8)
    axis.grid(alpha=0.3, axis="x", which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_resume(sections: dict[str, Any], path: Path) -> None:
    resume = sections.get("resume")
    entries: list[tuple[str, dict[str, Any]]] = []
    if resume:
        entries += [
            ("ours, in-process lease", resume["ours-in-process"]),
            ("ours, SqlTurnLease", resume["ours-sql"]),
            ("LangGraph", resume["langgraph"]),
        ]
    celery_resume = _get(sections, "celery_bench", "pools", "1", "resume")
    if celery_resume:
        entries.append(("ours, Celery", celery_resume))
    if not entries:
        return
    fig, axis = plt.subplots(figsize=(8, 3.5))
    positions = range(len(entries))
    axis.bar([p - 0.2 for p in positions], [e["p50"]["median"] for _, e in entries], width=0.4, label="p50")
    axis.bar([p + 0.2 for p in positions], [e["p99"]["median"] for _, e in entries], width=0.4, label="p99")
    axis.set_xticks(list(positions), [label for label, _ in entries])
    axis.set_ylabel("ms from submit_resume to completed")
    axis.legend()
    axis.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(memory: dict[str, Any], path: Path) -> None:
    fig, axis = plt.subplots(figsize=(8, 3.2))
    turns = [n for n, _ in memory["samples"]]
    mb = [value for _, value in memory["samples"]]
    axis.plot(turns, mb, marker="o")
    axis.set_xlabel("turns after warm-up")
    axis.set_ylabel("RSS (MB)")
    axis.set_ylim(0, max(mb) * 1.2)
    axis.set_title("AgentWorker process RSS (SQLite store)")
    axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- Document -------------------------------------------------------------------------------------

NOTES_TITLE = "## What limits the goals that were missed"


def limits_section(found: list[Goal], sections: dict[str, Any]) -> str:
    missed = [goal for goal in found if goal.met is False]
    if not missed:
        return "Every goal was met in this run."
    paragraphs = ["Missed in this run:\n\n" + "\n".join(f"- {goal.name}: {goal.measured}" for goal in missed)]
    for note in NOTES:
        if any(note.applies(goal.name) for goal in missed):
            text = note.text(sections)
            if text and text not in paragraphs:  # one explanation may cover several goals
                paragraphs.append(text)
    return "\n\n".join(paragraphs)


@dataclass
class Note:
    keyword: str
    text: Callable[[dict[str, Any]], str]

    def applies(self, goal_name: str) -> bool:
        return self.keyword in goal_name


NOTES: list[Note] = []
"""Explanations of missed goals from profiles, filled in by `notes.py`."""


def render(everything: dict[str, Any], docs: Path) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    sections: dict[str, Any] = everything["sections"]
    import notes  # noqa: F401  (registers the explanations of missed goals)

    found = goals(sections)
    parts = [
        "# Benchmarks",
        "Generated by `make bench` (`python bench/run.py`; `--quick` for a short smoke run). Every comparison "
        "below was measured in the same run, on this machine, with the peers' repetitions interleaved with ours; "
        "figures are the median of at least 3 repetitions with (min-max), and ratios are computed per repetition. "
        "Nothing here is a test assertion.",
        f"Whole run: {everything.get('seconds', 0) / 60:.1f} minutes.",
        "## Machine",
        machine_section(everything),
        "## Workload",
        "W(K): one turn = K tool calls, one per response of a scripted model (no network; it reads only the last "
        "message, so its own cost does not grow with history), then a final answer: 2K+1 steps (K=10 -> 21). "
        "Variants K=50 and K=200, and K=10 in a conversation that already holds 500 messages. The tool returns a "
        "short string. A step is one model call or one tool call, saved before the next begins.",
        "## Goals",
        table(
            ["goal", "target", "measured", "status"],
            [
                [g.name, g.target, g.measured, "not measured" if g.met is None else ("met" if g.met else "**missed**")]
                for g in found
            ],
        ),
    ]
    if "step_overhead" in sections:
        parts += ["## 1. In-memory engine", in_memory_section(sections["step_overhead"])]
    if "durable" in sections:
        parts += ["## 2. Durable, one process, PostgreSQL", durable_section(sections["durable"])]
    if "store_growth" in sections:
        parts += [
            "### The store alone: save cost against history length",
            store_growth_section(sections["store_growth"]),
        ]
    if "celery_bench" in sections:
        parts += ["## 3. Celery workers against a raw Celery chain", celery_section(sections["celery_bench"])]
    if "resume" in sections or "celery_bench" in sections:
        parts += ["## 4. Resume latency", resume_section(sections.get("resume"), sections.get("celery_bench"))]
    if "durable" in sections or "resume" in sections:
        parts += ["## 5. Peers: LangGraph", peers_section(sections.get("durable"), sections.get("resume"))]
    import admission
    import mcp_overhead
    import model_limits
    import model_overhead
    from latency import SECTION_TITLE, section

    for name, title, render_section in (
        ("memory", "## 6. Memory", memory_section),
        ("api_bench", "## 7. HTTP API: starting a turn", api_section),
        ("sse_bench", "## 8. Server-sent events: many followers of one conversation", sse_section),
        ("cli_startup", "## 9. Command line start-up", cli_section),
        ("latency", SECTION_TITLE, section),
        ("model_limits", model_limits.SECTION_TITLE, model_limits.section),
        ("admission", admission.SECTION_TITLE, admission.section),
        ("model_overhead", model_overhead.SECTION_TITLE, model_overhead.section),
        ("mcp_overhead", mcp_overhead.SECTION_TITLE, mcp_overhead.section),
    ):
        if name in sections:
            parts += [title, render_section(sections[name])]
    parts += [NOTES_TITLE, limits_section(found, sections)]
    plots = ["## Plots"]
    if "durable" in sections:
        plot_history(sections["durable"], docs / PLOT_HISTORY)
        plots.append(f"![per-step time and WAL bytes vs history length]({PLOT_HISTORY})")
    plot_rates(sections, docs / PLOT_RATES)
    if (docs / PLOT_RATES).exists():
        plots.append(f"![steps per second per configuration]({PLOT_RATES})")
    plot_resume(sections, docs / PLOT_RESUME)
    if (docs / PLOT_RESUME).exists():
        plots.append(f"![resume latency]({PLOT_RESUME})")
    if "memory" in sections:
        plot_memory(sections["memory"], docs / PLOT_MEMORY)
        plots.append(f"![worker RSS over turns]({PLOT_MEMORY})")
    parts += plots
    (docs / "benchmarks.md").write_text("\n\n".join(parts) + "\n")
