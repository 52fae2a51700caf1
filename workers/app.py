"""The entry point of the `celery` command: `celery -A workers.app worker` and `celery -A workers.app beat`.

Importing it reads the environment (see `workers.settings`) and builds the app with
`workers.celery_app.worker_app.create_worker_app`. Code that has settings of its own builds an
app from them instead, without importing this module.
"""

from __future__ import annotations

from workers.celery_app.worker_app import create_worker_app
from workers.settings import WorkerSettings

settings = WorkerSettings.from_env()
"""The settings this process's app was configured from (read once, at import)."""

app = create_worker_app(settings)
"""The app the `celery` command loads with `-A workers.app`."""
