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
        f"{max(ours_ms - ours_cpu, 0):.3f} ms is the wait for PostgreSQL's execution and commit. Splitting that CPU "
        "with SQLAlchemy's cursor events (process time before and after each `cursor.execute`, and around "
        "`SqlAgentTurnStore.save`): about half is SQLAlchemy Core's per-execution work on the save statement (a "
        "cached CTE with about 25 bound parameters: cache key, parameter processing, result setup, connection "
        "checkout), about a third is psycopg, about a sixth is the runner and the state machine; the store's own "
        "Python (header JSON, message rows, snapshot copies) is about 10 us. LangGraph takes "
        f"{lg_ms:.3f} ms per step, {lg_cpu:.3f} ms of it CPU, and its cost grows with the history (K=200 rows and "
        "the plot), so the ratio widens on longer turns; at K=10 its history is short and our fixed cost per step, "
        "the commit, weighs more. What would move it: executing the hot save through the driver with a statement "
        "rendered once (psycopg prepares it server-side), which removes most of SQLAlchemy's share; and fewer "
        "index entries per save (every save changes `updated_at`, which two indexes of `agent_turns` cover, so no "
        "save is a HOT update and each inserts into all six indexes of the table). The commit itself stays: every "
        "stable boundary is durable before the next step starts."
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
    growth = ""
    if k200 and prior:
        growth = (
            f" The runner's worker CPU per step grows with the history: {k10['runner']['worker_ms_per_step']['median']:.2f}"
            f" ms at K=10, {k200['runner']['worker_ms_per_step']['median']:.2f} ms at K=200, "
            f"{prior['runner']['worker_ms_per_step']['median']:.2f} ms for K=10 with 500 prior messages attached, "
            "while the in-process durable path stays flat (section 2)."
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
        "(acquire and release), a full snapshot load after taking the lease, and after releasing it a second full "
        "load to decide on the follow-up message, then the publish of that message. A py-spy profile of a pool "
        "process on W K=10 (`py-spy record --gil -p <pool pid>`) puts about 40% of its CPU in "
        "`SqlAgentTurnStore.load` (two per task: the header, every message row, and the pydantic validation of the "
        "whole snapshot), about 40% in the steps themselves and about 10% in publishing the follow-up." + growth + " "
        "Remedies, in order of effect: (1) let `SqlAgentTurnStore.load` reuse the messages of a snapshot it saved or "
        "loaded itself when the stored header still has the same version and message count (messages are "
        "append-only, so only the header needs reading); this makes a load O(1) in the history length; (2) decide "
        "the follow-up from the header alone (status, version, retry time) instead of a full load; (3) more steps "
        "per task when fairness allows." + sixteen_text
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
        "**Resume latency in-process.** The path is: `submit_resume` loads the turn (header and messages), "
        "validates and saves it; the dispatch wakes a worker thread, which does not know which turn woke it and "
        "polls `list_runnable`; it takes the lease, loads the snapshot that `submit_resume` has just saved, runs "
        "the tool step and the model step (one save each)." + counts + " Each statement is a round trip to a "
        "server on the same two cores, plus SQLAlchemy's per-statement work. Remedies: the worker's dispatch could "
        "carry the turn id and the saved snapshot, so the woken thread skips the poll and, once it holds the lease, "
        "reads only the header to check the version; the snapshot reuse proposed for the Celery path removes the "
        "message read too. Reads on PostgreSQL already run in autocommit (no BEGIN/ROLLBACK round trips)."
    )


NOTES.append(Note("LangGraph", _durable))
NOTES.append(Note("Celery path", _celery))
NOTES.append(Note("Resume to completion, in-process", _resume))
