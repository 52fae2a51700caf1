"""Names of the Celery tasks, shared by the app that schedules them and the code that sends them.

Producers send tasks by name, so a web app needs neither the task modules nor the agents.

Queues: every message goes to the configured queue (`AGENT_RUNNER_QUEUE`), except the first
step of a turn, which goes to the queue of new turns beside it. Workers take from the
configured queue first, so a turn that has started is not sent behind a backlog of turns
that have not (see `workers.celery_app.config`).
"""

from __future__ import annotations

STEP_TURN = "agent_runner.step_turn"
DISPATCH_INBOX = "agent_runner.dispatch_inbox"
SWEEP_INBOX = "agent_runner.sweep_inbox"
SWEEP_STALE_TURNS = "agent_runner.sweep_stale_turns"
SWEEP_DUE_RETRIES = "agent_runner.sweep_due_retries"
SWEEP_DEADLINES = "agent_runner.sweep_deadlines"
SWEEP_ADMISSION = "agent_runner.sweep_admission"
RUN_SCHEDULE = "agent_runner.run_schedule"
DELIVER_WEBHOOKS = "agent_runner.deliver_webhooks"

SWEEP_LABELS = frozenset({"inbox", "stale_turns", "due_retries", "deadlines", "admission"})
"""The sweeps whose runs are counted in the metrics, by their `sweep` label (`workers.sweeps.Sweep.name`).

Webhook deliveries are not: they send no work on, and their outcomes are in the delivery log.
"""


def new_turns_queue(queue: str) -> str:
    """The queue of the first steps of turns, beside `queue` (which carries every step after those)."""
    return f"{queue}.new"
