"""Environment for child processes that import modules of the `tests` package."""

from __future__ import annotations

import os
from collections.abc import Mapping
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
