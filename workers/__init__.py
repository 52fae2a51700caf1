"""The processes people run around the core: the HTTP server, the Celery workers, the embedded worker and the CLI.

- `agent-runner serve` runs the HTTP API, its console and the client protocols
  (`workers.api`), with an embedded worker or in front of Celery workers;
- `celery -A workers.app worker` runs turns and `celery -A workers.app beat` schedules
  the sweeps (`workers.celery_app`, `workers.sweeps`);
- `agent-runner worker` runs turns in one process on the embedded default (`workers.embedded`);
- `workers.build_runner()` gives a web app a runner whose `start`, `submit_resume` and
  `cancel` enqueue work for the Celery workers (`workers.producer`).

Importing this package loads neither Celery nor the store: `build_runner` is imported on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.producer import build_runner

__all__ = ["build_runner"]


def __getattr__(name: str) -> Any:
    if name == "build_runner":
        from workers.producer import build_runner

        return build_runner
    raise AttributeError(f"module 'workers' has no attribute {name!r}")
