"""Child processes of the tests: their environment, and signals to their process groups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the `tests` package (and the project's own packages)."""


def with_tests_importable(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` whose PYTHONPATH starts with the repository root.

    A worker started with it can import `tests.integration...` modules by their package
    path (for example an agent loader named `tests.integration.celery_workers.celery_agents:build_loader`)
    whatever its working directory is.
    """
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path}


def run_module(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args...` in a fresh interpreter from the repository root; its output as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=with_tests_importable(os.environ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def signal_group(pgid: int, signum: int) -> None:
    """Send `signum` to every process of the group `pgid`; a group that is gone already is ignored.

    The tests start their workers with `start_new_session=True`, so a worker's pid is the id
    of a group holding it and every process it forked (a Celery pool, for example).
    """
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


@contextmanager
def frozen(pgid: int) -> Iterator[None]:
    """Stop every process of the group `pgid` (SIGSTOP) for the `with` block, then let them go on (SIGCONT).

    A frozen process runs nothing, its lease heartbeat included, like one stuck in a long GC
    pause or on a suspended VM; it resumes where it was, unaware of the time that passed. The
    group is continued whatever happens in the block, so that a later SIGTERM can stop it.
    """
    signal_group(pgid, signal.SIGSTOP)
    try:
        yield
    finally:
        signal_group(pgid, signal.SIGCONT)
