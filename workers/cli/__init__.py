"""The `agent-runner` command line: operate turns from a terminal.

Every command reads the database from `--database-url` or `AGENT_RUNNER_DATABASE_URL`
(default: the embedded SQLite file `./agent_runner.db`). Human-readable output by default,
`--json` for scripts. Every error is one `error: ...` line on standard error (form data
that fails its schema adds one `  - ...` line per schema error), never a traceback. The
exit status is 2 for bad input (an unknown turn, an invalid id, JSON or option value,
invalid form data, a command that does not fit the turn such as a cancel of an ended one,
arguments that are not UTF-8) and 1 for failures of the infrastructure (the database cannot
be reached, a store error).

One module per group of commands (`turns`, `db`, `processes`, `schedules`); `common` and
`context` hold what they share. The runner, the store and their dependencies (pydantic,
SQLAlchemy, Celery) are imported by the commands that use them, so `agent-runner --help`
and the simple commands start without loading what they do not need.
"""

from __future__ import annotations

import click

from workers.cli.common import Commands
from workers.cli.context import CliContext
from workers.cli.db import db, prune
from workers.cli.processes import demo, serve, worker
from workers.cli.schedules import schedules
from workers.cli.turns import cancel, resume, turns
from workers.defaults import DEFAULT_DATABASE_URL

__all__ = ["main"]

_URL_SOURCES = {
    click.core.ParameterSource.COMMANDLINE: "from --database-url",
    click.core.ParameterSource.ENVIRONMENT: "from AGENT_RUNNER_DATABASE_URL",
    click.core.ParameterSource.DEFAULT: "the default",
}


@click.group(cls=Commands)
@click.option(
    "--database-url",
    envvar="AGENT_RUNNER_DATABASE_URL",
    default=DEFAULT_DATABASE_URL,
    show_default=True,
    help="SQLAlchemy URL of the turn store.",
)
@click.option("--agents", envvar="AGENT_RUNNER_AGENT_LOADER", default=None, help="module:attribute of the agents.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def main(ctx: click.Context, database_url: str, agents: str | None, as_json: bool) -> None:
    """Operate agent-runner turns: inspect, resume, cancel, migrate, run a worker.

    Exit status: 0 done; 2 bad input, or a command that does not fit the turn (a cancel of
    a turn that has ended); 1 the database or another service failed.
    """
    source = ctx.get_parameter_source("database_url")
    origin = _URL_SOURCES.get(source, "") if source is not None else ""
    ctx.obj = CliContext(database_url, agents, as_json, origin)
    ctx.call_on_close(ctx.obj.close)


for _command in (cancel, db, demo, prune, resume, schedules, serve, turns, worker):
    main.add_command(_command)
