"""Explanations of missed goals, rendered into docs/benchmarks.md when the goal is missed in a run.

The figures come from the run being rendered; the mechanisms come from profiles of this
code base (py-spy on one process running W, `bench/profile_step.py`, and on a Celery pool
process), reproducible with the commands given in each note.
"""

from __future__ import annotations

from typing import Any

from report import NOTES, Note, _get


def _durable(sections: dict[str, Any]) -> str:
    entry = _get(sections, "durable", "throughput", "W K=10") or {}
    if not entry or "langgraph_steps_per_s" not in entry:
        return ""
    ours_ms = 1000 / entry["ours_steps_per_s"]["median"]
    ours_cpu = entry["ours_cpu_ms_per_step"]["median"]
    lg_ms = 1000 / entry["langgraph_steps_per_s"]["median"]
    lg_cpu = entry["langgraph_cpu_ms_per_step"]["median"]
    floor = entry.get("floor_ms_per_update", {}).get("median")
    floor_text = (
        f" The floor measured beside it, a bare prepared UPDATE of a row of the same size, takes {floor:.3f} ms: "
        "one round trip and one commit, which every step of ours pays too."
        if floor
        else ""
    )
    return (
        "**Durable path against LangGraph and the floor at K=10.** A step of ours is one round trip: the save "
        "statement (the compare-and-swap UPDATE of the turn's header, the INSERT of the new message and the INSERT "
        "of the step's events, fed by the UPDATE's RETURNING), prepared on a psycopg connection the store keeps "
        f"between steps and committed with fsync. Of our {ours_ms:.3f} ms per step, {ours_cpu:.3f} ms is CPU in "
        f"this process and the remaining {max(ours_ms - ours_cpu, 0):.3f} ms is the wait for PostgreSQL's "
        "execution and commit (on the same two cores, so the server's CPU and ours compete)." + floor_text + " "
        "The CPU is spread over the runner and state machine (immutable snapshot copies), the JSON of the "
        "snapshot's state, of the new message and of the events, and psycopg's binding of about 25 parameters "
        "(docs/profile.md, from `python bench/profile_step.py`, has the breakdown and a flame graph). Per turn "
        "there are also the creation (one statement) and the save that takes the READY turn, 23 statements for "
        f"21 steps. LangGraph takes {lg_ms:.3f} ms per step, {lg_cpu:.3f} ms of it CPU, and its cost grows with "
        "the history (K=200 rows and the plot), so the ratio widens on longer turns; on a loaded machine both "
        "sides slow down, LangGraph's CPU-bound steps the most. The commit itself stays: every stable boundary is "
        "durable before the next step starts."
    )


def _events(sections: dict[str, Any]) -> str:
    entry = _get(sections, "durable", "throughput", "W K=10") or {}
    if "events_on_over_off_time" not in entry:
        return ""
    return (
        "**The event log's cost.** With the log on, a step's statement also inserts its durable events (1.6 per "
        "step on W on average: TOOL_STARTED and TOOL_COMPLETED for a tool step, MODEL_RESPONSE for a model step, "
        "TURN_RUNNING and TURN_COMPLETED once per turn): a row of about 400 bytes each with three index entries "
        "(id, event id, tree position; the conversation position only for conversation events), about "
        f"{entry['ours_cpu_ms_per_step']['median'] - entry['without_events_cpu_ms_per_step']['median']:.3f} ms of "
        "CPU here for their JSON, and more WAL to flush at the commit. The same turns with the store handed no "
        f"events take {entry['without_events_ms_per_step']['median']:.3f} ms per step against "
        f"{entry['ours_ms_per_step']['median']:.3f} ms."
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
    four = _get(pools, "2, 4 steps/task", "throughput", "W K=10", "ratio")
    four_text = (
        f" With 4 steps per task (the default before the threads pool) and 2 processes the ratio is "
        f"{four['median']:.2f}x, against {_get(pools, '2', 'throughput', 'W K=10', 'ratio', 'median'):.2f}x with "
        f"{per_task}."
        if four and _get(pools, "2", "throughput", "W K=10", "ratio")
        else ""
    )
    return (
        "**Celery path against the raw chain.** The raw chain's hop costs the worker "
        f"{k10['raw']['worker_ms_per_step']['median']:.2f} ms of CPU (Celery's own receive, trace, acknowledge and "
        f"publish); a `step_turn` task pays that once per {per_task} steps, plus, per task: the Redis lease "
        "(acquire and release, a round trip each), one load after taking the lease (the header alone when this "
        "process saved the turn last, else the header and the messages added since), and the publish of the "
        "follow-up, decided without another read when the step budget ran out. A step's own save and load are "
        "the durable path's (one prepared statement each); its live events go to Redis from a thread of their "
        "own, so the step does not wait for them." + history + " With one process, each step also waits for its "
        "commit and each task for its round trips, so the ratio depends on the database's latency as much as on "
        "CPU, and varies from run to run on this shared machine, whose two cores also run PostgreSQL, Redis and "
        "other work." + four_text
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
        "Each statement is a round trip to a server on the same two cores (the loads and saves prepared on the "
        "driver, see the durable path), and each hand-over to the worker thread a wake-up of another thread. The "
        "load under the lease stays: it is what makes a stale dispatch harmless. With the SQL lease, acquiring and "
        "releasing it are a round trip each."
    )


NOTES.append(Note("LangGraph", _durable))
NOTES.append(Note("vs the floor", _durable))
NOTES.append(Note("event log on vs off", _events))
NOTES.append(Note("Celery path", _celery))
NOTES.append(Note("Resume to completion, in-process", _resume))
