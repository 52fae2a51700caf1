"""Alembic migrations of the agent-runner tables, and `migrate` to apply them.

The migration scripts live beside this file (`env.py`, `versions/`); no `alembic.ini` is
needed. To write a new revision, run for example:

    python -c "from alembic import command; from store.migrations import alembic_config; \\
        command.revision(alembic_config(), 'add a column', autogenerate=False)"
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from agent_runner.errors import StoreError
from store._engine import UrlOrEngine, display_url, resolve_engine, translated_errors, writer
from store.schema import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent

# Key of the PostgreSQL advisory lock that serializes concurrent upgrades (several
# workers starting at once), derived from a fixed name so every process agrees on it.
_LOCK_KEY = zlib.crc32(b"agent-runner migrations")


def alembic_config(connection: Connection | None = None) -> Config:
    """Return an Alembic configuration for these migrations, optionally bound to an open connection."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    """The newest revision of the migration scripts."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at, or None when the tables were never created."""
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


@dataclass(frozen=True)
class Migration:
    """What `migrate` did: the schema revision before and after."""

    before: str | None
    """The revision the database was at; None when it had no agent-runner tables."""
    after: str | None
    """The revision it is at now (the newest)."""

    @property
    def changed(self) -> bool:
        """Whether anything was created or upgraded."""
        return self.before != self.after

    def describe(self) -> str:
        """One line for a person: created, upgraded from one revision to another, or already current."""
        if self.before is None:
            return f"created the agent-runner schema at revision {self.after}"
        if self.changed:
            return f"upgraded the agent-runner schema from revision {self.before} to {self.after}"
        return f"the agent-runner schema is already at revision {self.after}"


def migrate(url_or_engine: UrlOrEngine) -> Migration:
    """Upgrade the database to the newest revision (Alembic `upgrade head`); a no-op when it is current.

    Safe to call from several processes at once: on PostgreSQL an advisory lock serializes
    them, on SQLite the write lock does.

    Returns:
        The revisions before and after, read under the same lock as the upgrade.

    Raises:
        StoreUnavailableError: The database could not be reached; nothing was changed.
    """
    from alembic import command

    engine, owned = resolve_engine(url_or_engine)
    try:
        with translated_errors(engine, "migrating the agent-runner tables"), writer(engine).begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            before = current_revision(connection)
            command.upgrade(alembic_config(connection), "head")
            return Migration(before=before, after=current_revision(connection))
    finally:
        if owned:
            engine.dispose()


UPGRADE_COMMAND = "agent-runner db upgrade"
"""The command that migrates the database named by AGENT_RUNNER_DATABASE_URL (or --database-url)."""


class SchemaVersionError(StoreError):
    """The database's agent-runner tables are missing or at another revision than this code needs.

    Attributes:
        url: The database, its password masked.
        current: The revision the database is at (None: no agent-runner tables).
        head: The revision this code needs.
    """

    def __init__(self, url: str, current: str | None, head: str | None, known: bool) -> None:
        self.url = url
        self.current = current
        self.head = head
        if current is None:
            message = (
                f"the database {url} has no agent-runner tables (this version needs schema revision {head}); "
                f"create them with `{UPGRADE_COMMAND}` (AGENT_RUNNER_DATABASE_URL={url})"
            )
        elif known:
            message = (
                f"the database {url} is at schema revision {current}, this version needs {head}; "
                f"migrate it with `{UPGRADE_COMMAND}` (AGENT_RUNNER_DATABASE_URL={url})"
            )
        else:
            message = (
                f"the database {url} is at schema revision {current}, which this version does not know "
                f"(it needs {head}): it was migrated by a newer agent-runner; deploy that version here too"
            )
        super().__init__(message)


def check_schema(url_or_engine: UrlOrEngine) -> str:
    """Check that the database is migrated to the revision this code needs; return that revision.

    Processes that share a database (workers, web apps, the server) call this at start-up,
    so a deployment that skipped the migration fails at once with the command that fixes
    it, rather than later with a missing table. SQLite databases are migrated on first use
    by the backends themselves; check them after building one.

    Raises:
        SchemaVersionError: The tables are missing, behind, or from a newer version.
        StoreUnavailableError: The database could not be reached.
    """
    engine, owned = resolve_engine(url_or_engine)
    try:
        with translated_errors(engine, "checking the agent-runner schema"), engine.connect() as connection:
            current = current_revision(connection)
    finally:
        if owned:
            engine.dispose()
    head = head_revision()
    if current is not None and current == head:
        return current
    raise SchemaVersionError(display_url(engine.url), current, head, _is_known(current))


def _is_known(revision: str | None) -> bool:
    """Whether `revision` is one of this code's migrations (an older one, when it is not the head)."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    if revision is None:
        return False
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


def ensure_embedded_schema(engine: Engine) -> None:
    """Migrate a SQLite database that is missing the tables or behind; PostgreSQL is migrated explicitly.

    The embedded default must work on first use with nothing set up, while a shared
    production database is upgraded by a deliberate `migrate` at deploy time.
    """
    if engine.dialect.name != "sqlite":
        return
    with translated_errors(engine, "checking the agent-runner tables"), engine.connect() as connection:
        current = current_revision(connection)
    if current != head_revision():
        migrate(engine)
