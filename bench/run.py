"""Run every benchmark and write docs/benchmarks.md and the plots (what `make bench` does).

Each section runs in a process of its own (`python bench/<section>.py --json ...`), so one
section's imports, caches and garbage do not weigh on the next, and the memory section
measures a clean process. The results are collected as JSON, then rendered by `report.py`.

    python bench/run.py            # the full run (about 7-12 minutes on 2 cores)
    python bench/run.py --quick    # a smoke run of every section (about 3 minutes)
    python bench/run.py --only durable,resume
    python bench/run.py --render-only DIR   # re-render docs from the JSON of an earlier run

PostgreSQL and Redis must be up (`make services`); see `_common.py` for their URLs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import HERE, ROOT, log, machine_facts

SECTIONS = (
    "step_overhead",
    "durable",
    "store_growth",
    "resume",
    "celery_bench",
    "memory",
    "api_bench",
    "sse_bench",
    "cli_startup",
    "latency",
    "model_limits",
    "admission",
    "model_overhead",
    "mcp_overhead",
)
SECTION_TIMEOUT_S = 900


def run_section(name: str, quick: bool, folder: Path) -> dict[str, Any]:
    output = folder / f"{name}.json"
    args = [sys.executable, str(HERE / f"{name}.py"), "--json", str(output)]
    if quick:
        args.append("--quick")
    started = time.monotonic()
    load_before = os.getloadavg()
    completed = subprocess.run(args, cwd=ROOT, timeout=SECTION_TIMEOUT_S, stdout=subprocess.PIPE, text=True)
    elapsed = time.monotonic() - started
    sys.stdout.write(completed.stdout)
    if completed.returncode != 0:
        raise SystemExit(f"bench/{name}.py failed with exit code {completed.returncode}")
    results: dict[str, Any] = json.loads(output.read_text())
    results["_seconds"] = elapsed
    # Other work on the machine shows up here (the 1-minute load average, before and after).
    results["_load"] = [load_before[0], os.getloadavg()[0]]
    log(f"{name}: {elapsed:.0f} s")
    return results


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of every section")
    parser.add_argument("--only", default=None, help=f"comma-separated sections among {', '.join(SECTIONS)}")
    parser.add_argument("--results", type=Path, default=None, help="folder for the JSON results (default: a temp dir)")
    parser.add_argument("--render-only", type=Path, default=None, help="render the docs from this results folder")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where benchmarks.md and the plots go")
    args = parser.parse_args()
    missing = [name for name in ("matplotlib", "psutil", "langgraph", "langchain_core") if not _importable(name)]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: install the bench extra, pip install -e '.[bench]'")

    import report

    if args.render_only is not None:
        report.render(json.loads((args.render_only / "all.json").read_text()), args.docs)
        return
    folder = args.results or Path(tempfile.mkdtemp(prefix="agent-runner-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    wanted = SECTIONS if args.only is None else tuple(s.strip() for s in args.only.split(","))
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    everything: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "machine": machine_facts(),
        "sections": {},
    }
    for name in wanted:
        everything["sections"][name] = run_section(name, args.quick, folder)
    everything["seconds"] = time.monotonic() - started
    (folder / "all.json").write_text(json.dumps(everything, indent=1, default=str))
    report.render(everything, args.docs)
    log(f"results in {folder}; report in {args.docs / 'benchmarks.md'}; {everything['seconds']:.0f} s in all")


if __name__ == "__main__":
    main()
