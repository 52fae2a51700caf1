"""Where a durable step's CPU goes: py-spy on workload W K=10, runner and SqlAgentTurnStore on PostgreSQL.

A child process runs W K=10 turns (`runner.run`, one thread, event log on) in a fresh
schema for a while; after its warm-up, py-spy samples it twice: with `--gil` (only samples
holding the GIL: the process's Python CPU, not its waits for the server) for the summary
and the flame graph, then without, to show how much of the wall time is spent waiting.
Written: docs/profile.md (the summary) and docs/profile_w_k10.svg (the flame graph).

Run: `python bench/profile_step.py [--seconds 15] [--docs DIR]` (py-spy from the bench
extra; it needs permission to read another process's memory, as root or with ptrace allowed).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _common import HERE, ROOT, log

PY_SPY = str(Path(sys.executable).with_name("py-spy"))

CHILD = """
import sys, time
sys.path.insert(0, {here!r})
from _common import pg_schema, w_agent
import store
from agent_runner import AgentExecutionPolicy, AgentRunner

seconds = float(sys.argv[1])
with pg_schema("profile") as (url, _):
    engine = store.make_engine(url)
    runner = AgentRunner(turn_store=store.SqlAgentTurnStore(engine), policy=AgentExecutionPolicy(max_steps=1000))
    agent = w_agent(10)
    for _ in range(20):
        runner.run(agent, "check my orders")
    print("ready", flush=True)
    turns, started, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        runner.run(agent, "check my orders")
        turns += 1
    steps = turns * 21
    print(f"{{(time.perf_counter() - started) * 1000 / steps:.3f}} {{(time.process_time() - cpu) * 1000 / steps:.3f}}")
    runner.turn_store.close()
    engine.dispose()
"""

_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^:]*)(:\d+)?\)$")


def _short(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match["path"]
    for marker in ("site-packages/", "/work/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{match['function']} ({path})"


def _layer(frame: str) -> str:
    match = _FRAME.match(frame)
    path = "/" + (match["path"] if match else frame)  # py-spy shows paths under the working directory relative
    for name, needle in (
        ("psycopg (driver)", "psycopg"),
        ("SQLAlchemy", "sqlalchemy"),
        ("pydantic (validation, copies, JSON)", "pydantic"),
        ("agent_runner (runner, state machine)", "/agent_runner/"),
        ("store (save and load)", "/store/"),
        ("workload (scripted model, tool, loop)", "/bench/"),
        ("json (stdlib)", "/json/"),
    ):
        if needle in path:
            return name
    return "other (stdlib, interpreter)"


def summarize(raw: Path) -> tuple[collections.Counter[str], collections.Counter[str], collections.Counter[str], int]:
    """(self samples by layer, self samples by function, inclusive samples by function, total) of py-spy raw output."""
    layers: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f]
        total += count
        layers[_layer(frames[-1])] += count
        own[_short(frames[-1])] += count
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += count
    return layers, own, inclusive, total


def record(pid: int, seconds: float, output: Path, fmt: str, gil: bool) -> None:
    args = [PY_SPY, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "-o", str(output), "-f", fmt]
    if gil:
        args.append("--gil")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of each py-spy recording")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where profile.md and the SVG go")
    args = parser.parse_args()
    if not Path(PY_SPY).exists():
        raise SystemExit("py-spy is missing: install the bench extra, pip install -e '.[bench]'")
    folder = Path(tempfile.mkdtemp(prefix="agent-runner-profile-"))
    run_seconds = 3 * args.seconds + 10
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(here=str(HERE)), str(run_seconds)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise SystemExit("the workload did not start")
    load_before = os.getloadavg()[0]
    log("profile: flame graph (GIL samples)")
    record(child.pid, args.seconds, args.docs / "profile_w_k10.svg", "flamegraph", gil=True)
    log("profile: CPU samples")
    record(child.pid, args.seconds, folder / "gil.txt", "raw", gil=True)
    log("profile: all samples")
    record(child.pid, args.seconds, folder / "all.txt", "raw", gil=False)
    ms_per_step, cpu_per_step = (float(v) for v in child.communicate()[0].split())
    load_after = os.getloadavg()[0]

    layers, own, inclusive, total = summarize(folder / "gil.txt")
    all_layers, all_own, _, all_total = summarize(folder / "all.txt")
    waiting = sum(count for name, count in all_own.items() if name.startswith(("Connection.wait", "BaseCursor._send")))

    def share(count: int, of: int) -> str:
        return f"{100 * count / of:.1f}%"

    lines = [
        "# Profile of a durable step",
        f"Generated by `python bench/profile_step.py` on {datetime.now(UTC):%Y-%m-%d %H:%M UTC} (1-minute load "
        f"average {load_before:.1f} -> {load_after:.1f}; the machine is shared, so absolute times vary from run to "
        "run). Workload W K=10 (21 steps per turn, fresh turn each time), `runner.run` in one thread, "
        "`SqlAgentTurnStore` on PostgreSQL, event log on. py-spy sampled the process at 200 Hz for "
        f"{args.seconds:.0f} s per recording; while it did, a step took {ms_per_step:.3f} ms, {cpu_per_step:.3f} ms "
        "of it CPU in this process (sampling slows the process somewhat).",
        "Flame graph of the CPU samples (those holding the GIL): [profile_w_k10.svg](profile_w_k10.svg).",
        "## Where the CPU goes, by layer",
        "Samples holding the GIL, by the layer of the innermost frame:",
        "| layer | share of CPU samples |",
        "|---|---|",
        *[f"| {name} | {share(count, total)} |" for name, count in layers.most_common()],
        f"All samples (waits included): {share(waiting, all_total)} were in psycopg waiting for the server "
        "(`Connection.wait` and the send of the prepared statement).",
        "## Functions with the most CPU samples of their own",
        "| function | share |",
        "|---|---|",
        *[f"| `{name}` | {share(count, total)} |" for name, count in own.most_common(20)],
        "## Inclusive CPU of the main frames",
        "| function | share (with what it calls) |",
        "|---|---|",
        *[
            f"| `{name}` | {share(count, total)} |"
            for name, count in inclusive.most_common(60)
            if count < total and any(k in name for k in ("agent_runner", "store/", "psycopg/cursor", "pydantic/main"))
        ][:25],
    ]
    (args.docs / "profile.md").write_text("\n\n".join(_join_tables(lines)) + "\n")
    log(f"profile in {args.docs / 'profile.md'}")


def _join_tables(lines: list[str]) -> list[str]:
    """Keep the rows of a table together (the document joins paragraphs with blank lines)."""
    joined: list[str] = []
    for line in lines:
        if line.startswith("|") and joined and joined[-1].startswith("|"):
            joined[-1] += "\n" + line
        else:
            joined.append(line)
    return joined


if __name__ == "__main__":
    started = time.monotonic()
    main()
    log(f"profile: {time.monotonic() - started:.0f} s")
