"""Explanations of missed goals, rendered into docs/benchmarks.md when the goal is missed in a run.

The figures come from the run being rendered; the mechanisms come from profiles of this
code base (py-spy on a Celery pool process, cProfile and pyinstrument in one process),
reproducible with the commands given in each note.
"""

from __future__ import annotations

from typing import Any

from report import NOTES, Note, _get


def _durable(sections: dict[str, Any]) -> str:
    entry = _get(sections, "durable", "throughput", "W K=10") or {}
    if not entry:
        return ""
    ours_ms = 1000 / entry["ours_steps_per_s"]["median"]
    ours_cpu = entry["ours_cpu_ms_per_step"]["median"]
    lg_ms = 1000 / entry["langgraph_steps_per_s"]["median"]
    lg_cpu = entry["langgraph_cpu_ms_per_step"]["median"]
    return (
        "**Durable path against LangGraph at K=10.** A step of ours is one round trip: the compare-and-swap "
        "UPDATE of the turn's header and the INSERT of the new message as one autocommitted statement, committed "
        f"with fsync. Of our {ours_ms:.3f} ms per step, {ours_cpu:.3f} ms is CPU in this process and the remaining "
        f"{max(ours_ms - ours_cpu, 0):.3f} ms is the wait for PostgreSQL's execution and commit. Most of that CPU is "
        "per-statement work below the store: SQLAlchemy Core executing the cached save statement (execution "
        "context, about 25 bound parameters, result setup, a pooled connection switched to autocommit and back) "
        "and psycopg, which already runs the statement prepared server-side after its first executions. The "
        "store's own Python (header JSON, message rows, the returned snapshot) is about 10 us, and the runner and "
        "state machine take a small share. For scale, measured with `time.process_time` around a loop here: "
        "`SELECT 1` through `Connection.execute` costs about 110 us of CPU, against about 60 us on the driver's "
        "cursor of a pooled connection; the same save statement sent on the driver's cursor saved about 0.05 ms per "
        "step through the pool and about 0.1 ms on a dedicated connection, which would narrow the gap without "
        "closing it, at the price of doing SQLAlchemy's error translation and connection invalidation by hand. "
        f"LangGraph takes {lg_ms:.3f} ms per step, {lg_cpu:.3f} ms of it CPU, and its cost grows with the history "
        "(K=200 rows and the plot), so the ratio widens on longer turns; at K=10 its history is short and our fixed "
        "cost per step, the commit, weighs more. The other lever is on the server: every save changes "
        "`updated_at`, which two indexes of `agent_turns` cover, so no save is a HOT update and each inserts into "
        "all six indexes of the table. The commit itself stays: every stable boundary is durable before the next "
        "step starts."
    )


def _celery(sections: dict[str, Any]) -> str:
    pools = _get(sections, "celery_bench", "pools") or {}
    one = _get(pools, "1", "throughput") or {}
    if not one:
        return ""
    per_task = sections["celery_bench"]["steps_per_task"]
    k10 = one["W K=10"]["cpu"]
    k200 = one.get("W K=200", {}).get("cpu")
    prior = one.get("W K=10, 500 prior, window 500", {}).get("cpu")
    history = ""
    if k200 and prior:
        short = k10["runner"]["worker_ms_per_step"]["median"]
        long = k200["runner"]["worker_ms_per_step"]["median"]
        trend = "about the same" if long <= short * 1.15 else f"{long / short:.2f}x as much"
        history = (
            f" The runner's worker CPU per step is {short:.2f} ms at K=10 and {long:.2f} ms at K=200 ({trend}: a "
            "load reads only the messages added since the process last saw the turn); with 500 prior messages "
            f"attached it is {prior['runner']['worker_ms_per_step']['median']:.2f} ms, as each step also projects its "
            "message into the chat memory (one more statement) and a process reads a history it has not seen yet "
            "in full once."
        )
    sixteen = _get(pools, "2, 16 steps/task", "throughput", "W K=10", "ratio")
    sixteen_text = (
        f" With 16 steps per task and 2 processes the ratio is {sixteen['median']:.2f}x, against "
        f"{_get(pools, '2', 'throughput', 'W K=10', 'ratio', 'median'):.2f}x with {per_task}."
        if sixteen and _get(pools, "2", "throughput", "W K=10", "ratio")
        else ""
    )
    return (
        "**Celery path against the raw chain.** The raw chain's hop costs the worker "
        f"{k10['raw']['worker_ms_per_step']['median']:.2f} ms of CPU (Celery's own receive, trace, acknowledge and "
        f"publish); a `step_turn` task pays that once per {per_task} steps, plus, per task: the Redis lease "
        "(acquire and release, a round trip each), one load after taking the lease (the header alone when this "
        "process saved the turn last, else the header and the messages added since), and the publish of the "
        "follow-up, decided without another read when the step budget ran out. A py-spy profile of a pool process "
        "on W K=10 (`py-spy record --gil -p <pool pid>`) puts about a third of its CPU in the saves (mostly "
        "SQLAlchemy and psycopg per statement, see the durable path), about a fifth in publishing the follow-up, "
        "about a sixth in the load and under a tenth in the Redis lease." + history + " With one process, each "
        "step also waits for its commit and each task for its round trips, so the ratio depends on the database's "
        "latency as much as on CPU, and varies from run to run on this shared machine. What is left: a cheaper "
        "statement execution (the durable path's lever), or more steps per task when fairness allows." + sixteen_text
    )


def _resume(sections: dict[str, Any]) -> str:
    resume = sections.get("resume")
    if not resume:
        return ""
    sql = resume.get("ours-sql-statements")
    local = resume.get("ours-in-process-statements")
    counts = (
        f" It sends {local:.0f} SQL statements with the in-process lease and {sql:.0f} with the SQL lease (lease "
        "release included)."
        if sql and local
        else ""
    )
    return (
        "**Resume latency in-process.** The path is: `submit_resume` loads the turn (its header: the store keeps the "
        "messages of the turns it saved or loaded), validates the command and saves it; the dispatch hands the turn "
        "to a worker thread, which takes the lease, loads the turn again (again the header: it must see the version "
        "stored after the lease was taken), runs the tool step and the model step (one save each)." + counts + " "
        "Each statement is a round trip to a server on the same two cores, plus SQLAlchemy's per-statement work "
        "(see the durable path). The load under the lease stays: it is what makes a stale dispatch harmless. With "
        "the SQL lease, acquiring and releasing it are a round trip each; reads on PostgreSQL already run in "
        "autocommit (no BEGIN/ROLLBACK round trips)."
    )


NOTES.append(Note("LangGraph", _durable))
NOTES.append(Note("Celery path", _celery))
NOTES.append(Note("Resume to completion, in-process", _resume))
