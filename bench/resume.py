"""Resume latency: a person approves a tool call; how long until the turn has completed?

Ours: a turn of the approval workload (one `refund` call that needs approval, then a final
answer) waits in WAITING_FOR_APPROVAL in PostgreSQL. The clock starts before
`runner.submit_resume(turn_id, approve_tool(call_id))` and stops when the embedded
`AgentWorker` (threads in this process, woken by the runner's dispatch) has saved the
COMPLETED snapshot: the resume's save, the lease, the load, the tool step and the final
model step. Two leases: the SQL lease in the same PostgreSQL (what several worker
processes on one database share) and the in-process lease.

LangGraph: the same workload as a graph whose `approval` node calls `interrupt()` before
the ToolNode, checkpointed by PostgresSaver with durability "sync". The clock covers
`invoke(Command(resume=...))` on a graph compiled separately, on its own connection, that
holds nothing of the run that stopped: the tool node and the final model node.

Samples alternate between the configurations; each repetition reports p50 and p99.

Run: `python bench/resume.py [--quick] [--json PATH]`.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from _common import DriverBytes, Stat, approval_agent, arguments, latency_summary, libpq, log, pg_schema, write_results

import store
from agent_runner import (
    AgentEvent,
    AgentEventType,
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    InMemoryTurnLease,
)
from agent_runner.worker import AgentWorker


class Completions:
    """An event listener that records when each turn completed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[str, threading.Event] = {}
        self.at: dict[str, float] = {}

    def expect(self, turn_id: str) -> threading.Event:
        event = threading.Event()
        with self.lock:
            self.waiting[turn_id] = event
        return event

    def __call__(self, event: AgentEvent) -> None:
        if event.type is AgentEventType.TURN_COMPLETED:
            now = time.perf_counter()
            with self.lock:
                waiter = self.waiting.pop(event.turn_id, None)
                self.at[event.turn_id] = now
            if waiter is not None:
                waiter.set()


class OursSetup:
    """A runner on PostgreSQL with an AgentWorker; suspended approval turns on demand."""

    def __init__(self, url: str, lease_kind: str) -> None:
        self.engine = store.make_engine(url)
        self.runner = AgentRunner(turn_store=store.SqlAgentTurnStore(self.engine))
        self.completions = Completions()
        self.runner.add_event_listener(self.completions)
        lease = store.SqlTurnLease(self.engine) if lease_kind == "sql" else InMemoryTurnLease()
        self.worker = AgentWorker(self.runner, lease=lease, concurrency=1, poll_interval=0.5)
        self.agent = approval_agent()
        self.statements = DriverBytes(self.engine)

    def suspended(self) -> AgentTurn:
        # `run` drives the turn in this thread until it blocks on the approval.
        turn = self.runner.run(self.agent, "refund order 1001")
        if turn.status != "WAITING_FOR_APPROVAL":
            raise RuntimeError(f"expected a turn waiting for approval, got {turn.status}")
        return turn

    def resume(self, turn: AgentTurn) -> tuple[float, float]:
        """Approve and wait for completion; return (seconds to completion, seconds in submit_resume)."""
        assert turn.suspension is not None
        done = self.completions.expect(turn.id)
        command = AgentResumeCommand.approve_tool(turn.suspension.correlation_id)
        started = time.perf_counter()
        self.runner.submit_resume(turn.id, command)
        submitted = time.perf_counter()
        if not done.wait(10):
            raise TimeoutError(f"turn {turn.id} did not complete within 10 s of its approval")
        return self.completions.at[turn.id] - started, submitted - started

    def close(self) -> None:
        self.worker.stop()
        self.engine.dispose()


def measure(urls: dict[str, str], reps: int, samples: int) -> dict[str, Any]:
    """`urls`: a schema for each of our two setups (their workers must not see each other's turns) and LangGraph."""
    import langgraph_peer

    ours = {kind: OursSetup(urls[kind], kind) for kind in ("sql", "in-process")}
    with (
        langgraph_peer.postgres_saver(libpq(urls["langgraph"])) as first_saver,
        langgraph_peer.postgres_saver(libpq(urls["langgraph"])) as second_saver,
    ):
        stopping_graph = langgraph_peer.approval_graph(first_saver)
        resuming_graph = langgraph_peer.approval_graph(second_saver)
        try:
            # Turns are suspended while the workers are stopped, so no worker races the
            # thread that drives them up to the approval.
            warm = {kind: [setup.suspended() for _ in range(5)] for kind, setup in ours.items()}
            pending = {
                kind: [[setup.suspended() for _ in range(samples)] for _ in range(reps)] for kind, setup in ours.items()
            }
            for setup in ours.values():
                setup.worker.start()
            for index in range(5):
                for kind, setup in ours.items():
                    setup.resume(warm[kind][index])
                config = langgraph_peer.new_thread()
                langgraph_peer.run_to_interrupt(stopping_graph, config)
                langgraph_peer.resume(resuming_graph, config)
            runs: dict[str, list[list[float]]] = {"ours-sql": [], "ours-in-process": [], "langgraph": []}
            submit: list[float] = []
            for setup in ours.values():
                setup.statements.take()
            for rep_index in range(reps):
                threads = [langgraph_peer.new_thread() for _ in range(samples)]
                for config in threads:
                    langgraph_peer.run_to_interrupt(stopping_graph, config)
                gc.collect()
                rep: dict[str, list[float]] = {name: [] for name in runs}
                for index in range(samples):
                    for kind, setup in ours.items():
                        time.sleep(0.005)  # let the worker go back to waiting, as between real approvals
                        seconds, in_submit = setup.resume(pending[kind][rep_index][index])
                        rep[f"ours-{kind}"].append(seconds)
                        if kind == "sql":
                            submit.append(in_submit)
                    time.sleep(0.005)
                    started = time.perf_counter()
                    result = langgraph_peer.resume(resuming_graph, threads[index])
                    rep["langgraph"].append(time.perf_counter() - started)
                    if result["messages"][-1].content != "refund done":
                        raise RuntimeError("the resumed LangGraph run did not finish")
                for name, values in rep.items():
                    runs[name].append(values)
            statements = {kind: setup.statements.take()[0] / (reps * samples) for kind, setup in ours.items()}
        finally:
            for setup in ours.values():
                setup.close()
    results: dict[str, Any] = {"samples_per_rep": samples, "reps": reps}
    for kind, count in statements.items():
        # Statements SQLAlchemy sent per resume, the lease release included (BEGIN/COMMIT/ROLLBACK are not counted).
        results[f"ours-{kind}-statements"] = count
    for name, per_rep in runs.items():
        summaries = [latency_summary(values) for values in per_rep]
        pooled = latency_summary([v for values in per_rep for v in values])
        results[name] = {
            "p50": Stat.of([s["p50"] for s in summaries]).as_dict(),
            "p99": Stat.of([s["p99"] for s in summaries]).as_dict(),
            "pooled": pooled,
        }
        log(f"  {name}: p50 {results[name]['p50']['median']:.2f} ms, p99 {results[name]['p99']['median']:.2f} ms")
    results["ours_submit_resume"] = latency_summary(submit)
    sql_p50 = [latency_summary(v)["p50"] for v in runs["ours-sql"]]
    lg_p50 = [latency_summary(v)["p50"] for v in runs["langgraph"]]
    results["langgraph_over_ours_p50"] = Stat.of([lg / o for lg, o in zip(lg_p50, sql_p50, strict=True)]).as_dict()
    return results


def main() -> None:
    args = arguments(__doc__)
    log("resume latency (in-process worker, LangGraph)")
    with (
        pg_schema("bench") as (sql_url, _),
        pg_schema("bench") as (local_url, _),
        pg_schema("bench", migrate=False) as (langgraph_url, _),
    ):
        urls = {"sql": sql_url, "in-process": local_url, "langgraph": langgraph_url}
        results = measure(urls, 3, 30 if args.quick else 100)
    write_results(args.json, results)
    print("| path | p50 ms (median of reps) | min | max | p99 ms (median) | min | max |")
    print("|---|---|---|---|---|---|---|")
    for name in ("ours-sql", "ours-in-process", "langgraph"):
        p50, p99 = results[name]["p50"], results[name]["p99"]
        print(
            f"| {name} | {p50['median']:.2f} | {p50['min']:.2f} | {p50['max']:.2f} "
            f"| {p99['median']:.2f} | {p99['min']:.2f} | {p99['max']:.2f} |"
        )
    print(f"LangGraph p50 / ours p50: {results['langgraph_over_ours_p50']['median']:.2f}x")


if __name__ == "__main__":
    main()
