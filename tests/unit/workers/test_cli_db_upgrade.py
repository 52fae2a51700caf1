"""`agent-runner db upgrade` says what it did: created, upgraded from one revision to another, or nothing to do."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from click.testing import CliRunner, Result

from store.migrations import alembic_config, head_revision
from workers.cli import main


def _upgrade(url: str, *options: str) -> Result:
    return CliRunner().invoke(main, ["--database-url", url, *options, "db", "upgrade"])


def test_db_upgrade_reports_creating_then_nothing_to_do(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    head = head_revision()
    created = _upgrade(url)
    assert created.exit_code == 0, created.output
    assert created.output.startswith(f"created the agent-runner schema at revision {head} (")
    again = _upgrade(url)
    assert again.output.startswith(f"the agent-runner schema is already at revision {head} (")
    assert json.loads(_upgrade(url, "--json").output) == {"upgraded": False, "from_revision": head, "to_revision": head}


def test_db_upgrade_reports_the_revisions_it_upgraded_between(tmp_path: Path) -> None:
    # Given: a database migrated by an older version, to revision 0004
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0004")
    engine.dispose()
    # When: it is upgraded
    result = _upgrade(url, "--json")
    # Then: both revisions are reported
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"upgraded": True, "from_revision": "0004", "to_revision": head_revision()}
