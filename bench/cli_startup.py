"""Start-up time of the `agent-runner` command: `--help`, `turns list` on a SQLite file, and a bare Python.

Each command is run `--runs` times as a fresh process (the way a person or a script runs
it); the figures are the median and (min-max) wall-clock seconds. A bare `python -c pass`
is measured alongside, so the command's own cost reads apart from the interpreter's
start-up and the machine's load. The modules `--help` loads are listed by their top-level
package, which shows when a heavy dependency creeps back into the start-up path.

    python bench/cli_startup.py [--quick] [--json PATH] [--runs N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, arguments, log, machine_facts, write_results

AGENT_RUNNER = str(Path(sys.executable).parent / "agent-runner")


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def _summary(seconds: list[float]) -> dict[str, float]:
    return {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)}


def _help_packages() -> list[str]:
    code = (
        "import sys; from workers.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1].split()


def _prepared_database(folder: Path) -> str:
    """A SQLite file holding a few finished turns, as `turns list` would find them."""
    from agent_runner import Agent, AgentRunner, AiMessage, ScriptedChatModel
    from store import SqlAgentTurnStore

    url = f"sqlite:///{folder / 'cli.db'}"
    with SqlAgentTurnStore(url) as turn_store:
        runner = AgentRunner(turn_store=turn_store)
        for index in range(20):
            runner.run(Agent(id="bench", chat_model=ScriptedChatModel([AiMessage(f"answer {index}")])), "hi")
    return url


def measure(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as folder:
        url = _prepared_database(Path(folder))
        commands = {
            "python": [sys.executable, "-c", "pass"],
            "help": [AGENT_RUNNER, "--help"],
            "turns_list": [AGENT_RUNNER, "--database-url", url, "turns", "list"],
        }
        for command in commands.values():
            _timed(command)  # warm the file cache and the bytecode
        seconds: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, command in commands.items():  # interleaved, so load changes hit all alike
                seconds[name].append(_timed(command))
    results: dict[str, Any] = {name: _summary(values) for name, values in seconds.items()}
    results["runs"] = runs
    results["help_packages"] = _help_packages()
    return results


def main() -> None:
    def extra(parser: Any) -> None:
        parser.add_argument("--runs", type=int, default=None, help="runs of each command (default 15; 5 quick)")

    args = arguments(__doc__, extra)
    runs = args.runs if args.runs is not None else (5 if args.quick else 15)
    log(f"CLI start-up: {runs} runs of each command")
    try:
        machine = machine_facts()
    except ImportError:  # psutil comes with the bench extra; these figures do not need it
        machine = {"cpus": os.cpu_count(), "load": os.getloadavg()[0]}
    results = {"machine": machine, **measure(runs)}
    write_results(args.json, results)
    for name in ("python", "help", "turns_list"):
        figure = results[name]
        log(f"  {name}: {figure['median']:.3f} s ({figure['min']:.3f}-{figure['max']:.3f})")
    heavy = sorted(set(results["help_packages"]) & {"celery", "sqlalchemy", "fastapi", "openai", "pydantic"})
    log(f"  --help loads: {', '.join(heavy) or 'none of celery, sqlalchemy, fastapi, openai, pydantic'}")


if __name__ == "__main__":
    main()
