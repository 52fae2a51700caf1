"""The PostgreSQL one-statement save: what a fenced save sends, and a refused statement's fallback, counted and logged."""

from __future__ import annotations

import logging

import pytest

from agent_runner import LeaseLostError
from store import SqlAgentTurnStore
from store.turns import postgres
from tests.conftest import NON_UTC_ZONE
from tests.integration.store.store_kit import recording, step, turn_with_history

pytestmark = pytest.mark.integration


def test_a_fenced_save_on_postgresql_is_one_statement(pg_url: str) -> None:
    with SqlAgentTurnStore(pg_url) as turns:
        created = turns.save(turn_with_history("t-1", 3).model_copy(update={"lease_fence": 2}), -1)
        fenced = step(created).model_copy(update={"lease_fence": 3})
        with recording(turns.engine) as recorded:
            saved = turns.save(fenced, created.version)
        # One statement, autocommitted: the UPDATE guarded by version, message count and fence
        # (the fence is compared in its WHERE, not read first), with the INSERT of the new
        # message fed by its RETURNING. The store knows the message count from the creation.
        assert (recorded.statements, recorded.commits) == (["WITH"], 0)
        assert saved.lease_fence == 3 and turns.load("t-1") == saved
        # A lower fence is refused by the same statement; one SELECT then tells why
        with recording(turns.engine) as recorded, pytest.raises(LeaseLostError):
            turns.save(step(saved).model_copy(update={"lease_fence": 2}), saved.version)
        assert recorded.statements == ["WITH", "SELECT"]
        assert turns.fast_path_fallbacks == 0


def test_a_save_whose_one_statement_is_refused_wrongly_falls_back_counted_and_logged(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with SqlAgentTurnStore(pg_url) as turns:
        created = turns.save(turn_with_history("t-1", 3), -1)
        saved = turns.save(step(created), created.version)
        assert turns.fast_path_fallbacks == 0
        # Break the fast path: its guard now matches no row, whatever is stored
        healthy = postgres.save_statement
        monkeypatch.setattr(
            postgres,
            "save_statement",
            lambda parameters: healthy(parameters).replace("WHERE t.id", "WHERE false AND t.id"),
        )
        with caplog.at_level(logging.WARNING, logger="store.turns"):
            again = turns.save(step(saved), saved.version)
        assert turns.fast_path_fallbacks == 1
        assert [r.levelno for r in caplog.records if "one-statement save of turn t-1" in r.getMessage()] == [
            logging.WARNING
        ]
        # The transaction saved it all the same
        assert again.version == saved.version + 1 and turns.load("t-1") == again


@pytest.mark.parametrize(("sql_url", "zoned"), [("postgres", False), ("postgres-non-utc", True)], indirect=["sql_url"])
def test_the_non_utc_variant_of_the_store_tests_really_runs_in_another_zone(sql_url: str, zoned: bool) -> None:
    with SqlAgentTurnStore(sql_url) as turns, turns.engine.connect() as connection:
        zone = connection.exec_driver_sql("SHOW TimeZone").scalar()
    assert (zone == NON_UTC_ZONE) is zoned
