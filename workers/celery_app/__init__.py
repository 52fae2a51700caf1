"""The Celery side of agent-runner: the app factory, its tasks, beat's schedule and the dispatcher that sends work.

`workers.celery_app.config.create_app(settings)` builds an app that only sends tasks (a
web app, `workers.build_runner()`); `workers.celery_app.process.create_worker_app(settings)`
builds the app a `celery worker` or `celery beat` runs, with its tasks registered. Nothing
in this package reads the environment at import; `workers.app` is the `celery -A` entry
point that does.
"""
