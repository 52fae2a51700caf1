"""What the commands share: the database, the agents, the settings and the runner the deployment uses.

The runner, the store and their dependencies (pydantic, SQLAlchemy, Celery) are imported by
the methods that use them, so `agent-runner --help` and the simple commands start without
loading what they do not need.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from workers.cli.common import EXIT_BAD_INPUT, exit_code, fail, unusable_url

if TYPE_CHECKING:
    from agent_runner import AgentLoader, AgentRunner
    from store import SqlAgentTurnStore
    from workers.database import Database
    from workers.settings import WorkerSettings


class CliContext:
    """What the commands share: the database URL and where it came from, the agents, the runner.

    Commands that act on turns (`resume`, `cancel`) use the runner the deployment uses:
    with a broker configured (`CELERY_BROKER_URL` set, or a database other than SQLite)
    the Celery wiring of `workers.wiring.build_wiring` (dispatching runner, Redis guard),
    so a resumed turn is enqueued for the workers at once and a cancel frees the
    conversation's Redis mark; otherwise the embedded runner on the SQL store. Both get
    `AGENT_RUNNER_SETUP` applied.
    """

    def __init__(self, database_url: str, agents: str | None, as_json: bool, url_source: str = "") -> None:
        self.database_url = database_url
        self.agents = agents
        self.as_json = as_json
        self.url_source = url_source
        self._runner: AgentRunner | None = None
        self._database: Database | None = None
        self._closers: list[Callable[[], object]] = []

    @property
    def shown_url(self) -> str:
        """The database URL with its password masked, and where it came from."""
        from store.redaction import mask_url_secrets

        shown = mask_url_secrets(self.database_url)
        return f"{shown} ({self.url_source})" if self.url_source else shown

    def uses_broker(self) -> bool:
        """Whether the deployment runs Celery workers: a broker is configured, or the database is not SQLite."""
        return bool(os.environ.get("CELERY_BROKER_URL", "").strip()) or not self.database_url.startswith("sqlite")

    def settings(self) -> WorkerSettings:
        """The deployment's settings, with this command line's database and agents."""
        from workers.settings import SettingsError, WorkerSettings

        environ = {**os.environ, "AGENT_RUNNER_DATABASE_URL": self.database_url}
        if self.agents:
            environ["AGENT_RUNNER_AGENT_LOADER"] = self.agents
        try:
            return WorkerSettings.from_env(environ)
        except SettingsError as exc:
            fail(str(exc), EXIT_BAD_INPUT)

    def require_database(self) -> None:
        """Refuse to go on against a SQLite file that does not exist (a read would create an empty one)."""
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        from store.redaction import check_password_encoding

        try:
            check_password_encoding(self.database_url)
            url = make_url(self.database_url)
        except (ArgumentError, ValueError) as exc:
            unusable_url(self.database_url, exc)
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return
        if not os.path.exists(url.database):
            fail(
                f"no database at {self.shown_url}: the file {url.database} does not exist. "
                "Point --database-url (or AGENT_RUNNER_DATABASE_URL) at your database; "
                "`agent-runner db upgrade` creates a new one.",
                EXIT_BAD_INPUT,
            )

    def database(self) -> Database:
        """The database and its SQL backends, opened once as every process opens it (`workers.database`).

        A SQLite file that does not exist is created and migrated; commands on existing
        turns call `require_database` first.
        """
        if self._database is None:
            from agent_runner import AgentRunnerError
            from store import SchemaVersionError
            from store.redaction import check_password_encoding
            from workers.database import open_database

            try:
                check_password_encoding(self.database_url)  # a ValueError: bad input, below
                self._database = open_database(self.database_url)
            except SchemaVersionError as exc:  # names the database and `agent-runner db upgrade`
                fail(str(exc))
            except AgentRunnerError as exc:
                fail(f"{exc} (database {self.shown_url})", exit_code(exc))
            except Exception as exc:  # a URL SQLAlchemy cannot parse or has no driver for
                unusable_url(self.database_url, exc)
            self._closers.append(self._database.close)
        return self._database

    def turn_store(self) -> SqlAgentTurnStore:
        """The SQL turn store, for reading (an existing database at the schema this code needs)."""
        self.require_database()
        return self.database().turn_store

    def loader(self) -> AgentLoader:
        """The agents named by --agents (or AGENT_RUNNER_AGENT_LOADER); none when unset."""
        from workers.agents import load_agent_loader
        from workers.settings import SettingsError

        try:
            return load_agent_loader(self.agents)
        except SettingsError as exc:
            fail(str(exc), EXIT_BAD_INPUT)

    def runner(self) -> AgentRunner:
        """The runner `resume` and `cancel` act through (see the class docstring)."""
        if self._runner is None:
            self.require_database()
            self._runner = self._wired_runner() if self.uses_broker() else self.embedded_runner()
        return self._runner

    def embedded_runner(self) -> AgentRunner:
        """A runner on the SQL store that works in this process (SQLite migrates itself)."""
        from workers.embedded import embedded_runner
        from workers.settings import SettingsError

        settings = self.settings()
        loader = self.loader()
        try:
            return embedded_runner(settings, self.database(), loader)
        except SettingsError as exc:
            fail(str(exc), EXIT_BAD_INPUT)

    def _wired_runner(self) -> AgentRunner:
        from agent_runner import AgentRunnerError
        from workers.celery_app.config import create_app
        from workers.settings import SettingsError
        from workers.wiring import build_wiring

        settings = self.settings()
        try:
            wiring = build_wiring(settings, create_app(settings))
        except SettingsError as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except AgentRunnerError as exc:
            fail(f"{exc} (database {self.shown_url})", exit_code(exc))
        self._closers.append(wiring.close)
        return wiring.runner

    def close(self) -> None:
        """Close what the commands opened (pools, Redis clients)."""
        for close in reversed(self._closers):
            try:
                close()
            except Exception:  # closing is best effort on the way out
                pass
        self._closers.clear()

    def emit(self, data: Any, human: Callable[[], None]) -> None:
        """Print `data` as JSON with `--json`, else call `human` to print it readably."""
        if self.as_json:
            click.echo(json.dumps(data, indent=2, default=str))
        else:
            human()


pass_context = click.make_pass_decorator(CliContext)
"""Passes the `CliContext` of the command line to a command as its first argument."""
