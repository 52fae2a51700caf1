"""`agent-runner schedules list`: the scheduled turns and when each runs next."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import click

from workers.cli.common import EXIT_BAD_INPUT, fail
from workers.cli.context import CliContext, pass_context

SCHEDULERS = (
    "fired by every `agent-runner worker` and `agent-runner serve` (worker embedded) on the database, "
    "or by `celery -A workers.app beat` in a Celery deployment; each tick starts one turn"
)
"""Which processes fire the scheduled turns, as `schedules list` says."""


@click.group()
def schedules() -> None:
    """Scheduled turns, fired by `agent-runner worker`, `agent-runner serve` (embedded) or Celery beat."""


@schedules.command("list")
@click.option(
    "--schedules",
    "spec",
    envvar="AGENT_RUNNER_SCHEDULES",
    default=None,
    help="A .yaml/.json file or module:attribute of the schedules (default: AGENT_RUNNER_SCHEDULES).",
)
@pass_context
def schedules_list(obj: CliContext, spec: str | None) -> None:
    """List the scheduled turns and when each runs next."""
    from workers.schedules import ScheduleError, load_schedules

    try:
        found = load_schedules(spec)
    except ScheduleError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    now = datetime.now(UTC)
    rows = [{**schedule.to_dict(), "next_run": schedule.next_run(now).isoformat()} for schedule in found]

    def human() -> None:
        if not found:
            click.echo("no schedules (set AGENT_RUNNER_SCHEDULES or pass --schedules)")
            return
        for schedule in found:
            upcoming = schedule.next_run(now)
            local = upcoming.astimezone(ZoneInfo(schedule.timezone))
            click.echo(
                f"{schedule.name:<24} {schedule.agent_id:<20} {schedule.describe():<36} "
                f"conversation {schedule.conversation_id or '-'}  if busy {schedule.if_busy}  "
                f"next {local:%Y-%m-%d %H:%M:%S %Z}"
            )
        click.echo(f"({SCHEDULERS})")

    obj.emit(rows, human)
