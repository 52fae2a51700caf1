"""A step in a conversation against a plain step, on PostgreSQL, in one process, interleaved.

Three runners share one store, one chat memory provider and one connection pool, and take
turns running W(K=10) turns (21 steps each):

- plain: no conversation (explicit history);
- conversation, projected apart: a fresh conversation per turn, with the chat memory
  provider wrapped in a plain function, so the store cannot tell it is its own database's
  and the runner projects each save into ChatMemory with a statement of its own;
- conversation, projected in the save: the same, with the `SqlChatMemoryProvider` itself,
  which the store writes in the save's statement.

Per step: wall time, CPU of this process, CPU of the PostgreSQL backends serving the pool
(from /proc, so the server must run on this machine), and the statements sent, by kind.
Every statement of the per-step path is autocommitted, so each writing statement is a
commit. The order of the runners rotates from one repetition to the next.

    python bench/conversation_step.py [--reps 12] [--turns 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from _common import libpq, pg_schema, steps_per_turn, w_agent
from sqlalchemy.engine import make_url

import store
from agent_runner import AgentExecutionPolicy, AgentRunner, ChatMemory

K = 10
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Statements:
    """Counts the statements psycopg cursors run, by their first words, except those of `ignored`."""

    def __init__(self, ignored: psycopg.Connection[Any]) -> None:
        self.kinds: dict[str, int] = {}
        execute = psycopg.Cursor.execute

        def counted(cursor: Any, query: Any, params: Any = None, **options: Any) -> Any:
            if cursor.connection is ignored:
                return execute(cursor, query, params, **options)
            text = query if isinstance(query, str) else str(query)
            kind = "save" if text.startswith("WITH header") else " ".join(text.split()[:3])
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            return execute(cursor, query, params, **options)

        psycopg.Cursor.execute = counted  # type: ignore[method-assign]

    def take(self) -> dict[str, int]:
        taken, self.kinds = self.kinds, {}
        return taken


def backend_cpu(admin: psycopg.Connection[Any], application: str) -> float:
    """CPU seconds used so far by the backends of this benchmark's connections."""
    pids = [
        row[0] for row in admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application])
    ]
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _CLOCK_TICKS


def run_turns(runner: AgentRunner, turns: int, conversation: bool) -> None:
    agent = w_agent(K)
    for _ in range(turns):
        conversation_id = f"c-{uuid.uuid4().hex}" if conversation else None
        turn = runner.run(agent, "check my orders", conversation_id=conversation_id)
        if turn.status != "COMPLETED" or turn.steps != steps_per_turn(K):
            raise RuntimeError(f"unexpected end of a W({K}) turn: {turn.status} after {turn.steps} steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    application = f"conversation_step_{os.getpid()}"
    with pg_schema("convstep") as (url, _schema), psycopg.connect(libpq(url), autocommit=True) as admin:
        url = make_url(url).update_query_dict({"application_name": application}).render_as_string(hide_password=False)
        engine = sa.create_engine(url)
        turns = store.SqlAgentTurnStore(engine)
        provider = store.SqlChatMemoryProvider(engine)

        def apart(conversation_id: str) -> ChatMemory:
            return provider(conversation_id)

        policy = AgentExecutionPolicy(max_steps=1000)
        variants = {
            "plain step": (AgentRunner(turn_store=turns, chat_memory_provider=provider, policy=policy), False),
            "conversation, projected apart": (
                AgentRunner(turn_store=turns, chat_memory_provider=apart, policy=policy),
                True,
            ),
            "conversation, projected in the save": (
                AgentRunner(turn_store=turns, chat_memory_provider=provider, policy=policy),
                True,
            ),
        }
        statements = Statements(admin)
        for runner, conversation in variants.values():
            run_turns(runner, 3, conversation)
        statements.take()
        steps = options.turns * steps_per_turn(K)
        samples: dict[str, dict[str, list[float]]] = {
            name: {"ms": [], "cpu_ms": [], "server_cpu_ms": []} for name in variants
        }
        counted: dict[str, dict[str, int]] = {name: {} for name in variants}
        loads = [os.getloadavg()[0]]
        names = list(variants)
        for rep in range(options.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                runner, conversation = variants[name]
                gc.collect()
                server = backend_cpu(admin, application)
                cpu = time.process_time()
                started = time.perf_counter()
                run_turns(runner, options.turns, conversation)
                elapsed = time.perf_counter() - started
                samples[name]["ms"].append(elapsed * 1000 / steps)
                samples[name]["cpu_ms"].append((time.process_time() - cpu) * 1000 / steps)
                samples[name]["server_cpu_ms"].append((backend_cpu(admin, application) - server) * 1000 / steps)
                for kind, count in statements.take().items():
                    counted[name][kind] = counted[name].get(kind, 0) + count
            loads.append(os.getloadavg()[0])
        plain = samples["plain step"]["ms"]
        results: dict[str, Any] = {
            "k": K,
            "steps_per_rep": steps,
            "reps": options.reps,
            "load_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
            "fallbacks": turns.projection_fallbacks,
        }
        for name in names:
            entry = {key: statistics.median(values) for key, values in samples[name].items()}
            entry["over_plain"] = statistics.median([m / p for m, p in zip(samples[name]["ms"], plain, strict=True)])
            entry["statements_per_step"] = {
                kind: count / (steps * options.reps) for kind, count in sorted(counted[name].items())
            }
            results[name] = entry
            print(
                f"{name}: {entry['ms']:.3f} ms/step ({entry['over_plain']:.2f}x plain), CPU {entry['cpu_ms']:.3f} ms,"
                f" server CPU {entry['server_cpu_ms']:.3f} ms, statements/step "
                + ", ".join(f"{kind}: {count:.3f}" for kind, count in entry["statements_per_step"].items())
            )
        print(
            f"load average (1 min) over the run: {loads[0]:.2f} .. {max(loads):.2f}; fallbacks {results['fallbacks']}"
        )
        if options.json:
            options.json.write_text(json.dumps(results, indent=2))
        engine.dispose()


if __name__ == "__main__":
    main()
