"""`agent-runner db upgrade` and `prune`: the database's schema and the turns it keeps."""

from __future__ import annotations

import re
from datetime import timedelta

import click

from workers.cli.common import EXIT_BAD_INPUT, fail, unusable_url
from workers.cli.context import CliContext, pass_context

_AGE = re.compile(r"([0-9]{1,9})([smhd])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@click.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@pass_context
def db_upgrade(obj: CliContext) -> None:
    """Migrate the database to the newest schema (idempotent), and say what was done."""
    from agent_runner import AgentRunnerError
    from store import migrate

    try:
        done = migrate(obj.database_url)
    except AgentRunnerError as exc:
        fail(str(exc))
    except Exception as exc:
        unusable_url(obj.database_url, exc)
    data = {"upgraded": done.changed, "from_revision": done.before, "to_revision": done.after}
    obj.emit(data, lambda: click.echo(f"{done.describe()} ({obj.shown_url})"))


def parse_age(text: str) -> timedelta:
    """Return the duration written as a positive number with a unit: `90s`, `15m`, `12h`, `30d`.

    Raises:
        ValueError: The text is not such a duration.
    """
    match = _AGE.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"--older-than expects a positive number followed by s, m, h or d (such as 30d), got {text!r}")
    return timedelta(**{_AGE_UNITS[match.group(2)]: int(match.group(1))})


@click.command()
@click.option("--older-than", "older_than", required=True, metavar="AGE", help="Age such as 30d, 12h, 15m or 90s.")
@click.option("--batch-size", default=500, show_default=True, help="Turn trees (or rows) deleted per transaction.")
@pass_context
def prune(obj: CliContext, older_than: str, batch_size: int) -> None:
    """Delete turns that ended more than AGE ago, with their messages and events; active turns stay.

    The inbox messages those turns were started from and the settled webhook deliveries of
    their events go too, as do inbox messages that failed more than AGE ago.
    """
    from agent_runner import AgentRunnerError
    from store.webhooks import WebhookDeliveryLog

    try:
        age = parse_age(older_than)
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    if batch_size < 1:
        fail(f"--batch-size must be at least 1, got {batch_size}", EXIT_BAD_INPUT)
    obj.require_database()
    database = obj.database()
    try:
        # Turns first: inbox messages and deliveries go once what they point at is gone.
        removed = database.turn_store.prune(age, batch_size=batch_size)
        messages = database.inbox.prune(age, batch_size=batch_size)
        deliveries = WebhookDeliveryLog(database.engine).prune(age, batch_size=batch_size)
    except AgentRunnerError as exc:
        fail(str(exc))
    data = {
        "pruned_turns": removed,
        "pruned_inbox_messages": messages,
        "pruned_webhook_deliveries": deliveries,
        "older_than": older_than,
    }
    obj.emit(
        data,
        lambda: click.echo(
            f"pruned {removed} turn(s) that ended more than {older_than} ago, "
            f"{messages} inbox message(s) and {deliveries} webhook deliveries"
        ),
    )
