"""A tool body that kills its own process the first time it runs, like a worker stopped in the middle of a call."""

from __future__ import annotations

import os
import signal
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
