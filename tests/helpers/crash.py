"""Stopping a worker in the middle of a tool call: the tool kills its own process, or holds it for the test to kill."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CRASH_DIR_ENV = "TEST_CRASH_DIR"
"""Folder of the markers of crashes that happened; without it set, nothing crashes."""


def stop_this_process_once(key: str) -> None:
    """SIGKILL the calling process, unless it already happened for `key` (a marker file in CRASH_DIR_ENV says so).

    A non-idempotent tool calls it from its body: the first run dies after the runner saved
    the call's start and before any result, so the outcome is unknown; a run after a person
    chose to retry goes on. Does nothing when `TEST_CRASH_DIR` is not set.
    """
    folder = os.environ.get(CRASH_DIR_ENV)
    if not folder:
        return
    marker = Path(folder) / f"{key}.crashed"
    if marker.exists():
        return
    marker.write_text(str(os.getpid()), encoding="utf-8")
    os.kill(os.getpid(), signal.SIGKILL)


PAUSE_AT_ENV = "TEST_PAUSE_AT"
"""Name of the point at which `pause_this_process_once` holds a process; elsewhere it does nothing."""
PAUSE_LIMIT_S = 120.0
"""Longest a process is held for the test to kill it before it gives up (the test lost track)."""


def pause_this_process_once(point: str, key: str) -> None:
    """Hold the calling process at `point` until the test kills it, once per `key`.

    Does nothing unless `TEST_PAUSE_AT` names `point` and `TEST_CRASH_DIR` is set. The first
    time `key` reaches the point, a marker `<key>@<point>.paused` holding the pid appears in
    `TEST_CRASH_DIR` (see `paused_processes`) and the calling thread blocks; a later run of
    the same key (after the test killed the process and another took the work over) goes on.

    Raises:
        RuntimeError: Nobody killed the process within `PAUSE_LIMIT_S`.
    """
    folder = os.environ.get(CRASH_DIR_ENV)
    if not folder or os.environ.get(PAUSE_AT_ENV) != point:
        return
    marker = Path(folder) / f"{key}@{point}.paused"
    if marker.exists():
        return
    # Written under another name and renamed, so the test never reads a half-written pid.
    draft = marker.with_suffix(f".{os.getpid()}.draft")
    draft.write_text(str(os.getpid()), encoding="utf-8")
    draft.rename(marker)
    time.sleep(PAUSE_LIMIT_S)
    raise RuntimeError(f"process {os.getpid()} was held at {point!r} for {key!r} and nobody killed it")


def paused_processes(folder: Path) -> dict[str, int]:
    """The pid of every process held by `pause_this_process_once`, by `<key>@<point>`."""
    return {
        path.name.removesuffix(".paused"): int(path.read_text(encoding="utf-8")) for path in folder.glob("*.paused")
    }
