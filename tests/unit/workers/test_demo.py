"""`make demo` runs end to end on the embedded default."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers import demo


def test_the_demo_completes_on_sqlite_with_one_side_effect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo.CREATED_TICKETS.clear()
    assert demo.main(["--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "schema error" in out and "busy" in out and "status=APPROVED" in out and "CANCELLED" in out
    assert (tmp_path / "demo.db").exists()
