"""`agent-runner --help` and the group help start without the heavy dependencies; statuses still check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from workers.cli import main

ROOT = Path(__file__).resolve().parents[3]
HEAVY = (
    "celery",
    "kombu",
    "sqlalchemy",
    "alembic",
    "fastapi",
    "uvicorn",
    "openai",
    "redis",
    "pydantic",
    "agent_runner",
)


@pytest.mark.parametrize("args", [["--help"], ["turns", "--help"], ["db", "--help"], ["schedules", "--help"]])
def test_help_loads_none_of_the_heavy_dependencies(args: list[str]) -> None:
    # A fresh interpreter, as `agent-runner --help` starts one
    code = (
        "import sys\n"
        "from workers.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
        "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.strip().splitlines()[-1].split())
    assert "click" in loaded  # the probe saw the command run
    assert sorted(loaded & set(HEAVY)) == []


def test_the_status_filter_takes_any_case_and_lists_the_statuses_in_its_help(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'statuses.db'}"
    assert CliRunner().invoke(main, ["--database-url", url, "db", "upgrade"]).exit_code == 0
    listed = CliRunner().invoke(main, ["--database-url", url, "turns", "list", "--status", "completed"])
    assert listed.exit_code == 0, listed.output
    assert "WAITING_FOR_APPROVAL" in CliRunner().invoke(main, ["turns", "list", "--help"]).output


def test_an_unknown_status_is_refused_naming_the_statuses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'statuses.db'}"
    result = CliRunner().invoke(main, ["--database-url", url, "turns", "list", "--status", "DONE"])
    assert result.exit_code == 2
    assert "'DONE' is not one of READY, RUNNING" in result.output
