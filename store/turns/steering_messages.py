"""The steering messages of turns in SQL (`agent_runner.persistence.SteeringQueue`).

A message is one row of `agent_turn_steering`, written by any process without the turn's
lease; the row's `sequence` orders a turn's messages. Whether a message was applied is in the
turn's snapshot, not here, so applying one is part of the stepping process's fenced save.
Handing on the messages of an ended turn marks them `forwarded` in one UPDATE, which gives
each row to one caller only (PostgreSQL locks the rows it updates, SQLite runs one writer).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

import sqlalchemy as sa

from agent_runner.errors import TurnNotFound
from agent_runner.persistence import SteeringMessage
from store._backend import SqlBackend
from store._engine import AnyRow, dialect_insert, translated_errors
from store.schema import turn_steering, turns
from store.turns import postgres

# Built once: the per-model-call read runs from SQLAlchemy's compiled cache (SQLite), or
# prepared on the driver (PostgreSQL, the same SQL as text).
_UNFORWARDED_ON_DRIVER = (
    "SELECT turn_id, message_id, text, accepted_at, sequence, forwarded FROM agent_turn_steering"
    " WHERE turn_id = %(turn_id)s::text AND NOT forwarded ORDER BY sequence"
)
_UNFORWARDED = (
    sa.select(turn_steering)
    .where((turn_steering.c.turn_id == sa.bindparam("turn_id")) & sa.not_(turn_steering.c.forwarded))
    .order_by(turn_steering.c.sequence)
)


def _message(row: AnyRow) -> SteeringMessage:
    # The table's columns are the record's fields.
    return SteeringMessage(**row._asdict())


class SqlSteering(SqlBackend):
    """The `SteeringQueue` half of the SQL turn store."""

    def accept_steering(
        self, turn_id: str, message_id: str, text: str, accepted_at: datetime
    ) -> tuple[SteeringMessage, bool]:
        """Store a steering message of a stored turn, unless the turn has its id already; see `SteeringQueue`."""
        values = {
            "turn_id": turn_id,
            "message_id": message_id,
            "text": text,
            "accepted_at": accepted_at,
            "forwarded": False,
        }
        insert = (
            dialect_insert(self._engine, turn_steering)
            .values(values)
            .on_conflict_do_nothing(index_elements=["turn_id", "message_id"])
            .returning(turn_steering)
        )
        doing = f"accepting a steering message for turn {turn_id!r}"
        with translated_errors(self._engine, doing), self._writer.begin() as connection:
            if connection.execute(sa.select(turns.c.id).where(turns.c.id == turn_id)).first() is None:
                raise TurnNotFound(turn_id)
            stored = connection.execute(insert).first()
            if stored is not None:
                return _message(stored), True
            same = (turn_steering.c.turn_id == turn_id) & (turn_steering.c.message_id == message_id)
            return _message(connection.execute(sa.select(turn_steering).where(same)).one()), False

    def steering_messages(self, turn_id: str) -> list[SteeringMessage]:
        """The turn's steering messages not forwarded, in order; see `SteeringQueue`."""
        with translated_errors(self._engine, f"reading the steering messages of turn {turn_id!r}"):
            if self._direct():
                with self._driver.connection() as lent:
                    found = postgres.cursor(lent).execute(_UNFORWARDED_ON_DRIVER, {"turn_id": turn_id}, prepare=True)
                    rows = found.fetchall()
                return [
                    SteeringMessage(turn, message_id, text, postgres.utc(at) or at, sequence, forwarded)
                    for turn, message_id, text, at, sequence, forwarded in rows
                ]
            with self._reader.connect() as connection:
                return [_message(row) for row in connection.execute(_UNFORWARDED, {"turn_id": turn_id})]

    def take_unapplied_steering(self, turn_id: str, applied: Collection[str]) -> list[SteeringMessage]:
        """Mark and return the turn's steering messages neither applied nor forwarded; see `SteeringQueue`."""
        condition = (turn_steering.c.turn_id == turn_id) & sa.not_(turn_steering.c.forwarded)
        if applied:
            condition &= turn_steering.c.message_id.not_in(list(applied))
        update = sa.update(turn_steering).where(condition).values(forwarded=True).returning(turn_steering)
        doing = f"handing on the steering messages of turn {turn_id!r}"
        with translated_errors(self._engine, doing), self._writer.begin() as connection:
            rows = connection.execute(update).all()
        return sorted((_message(row) for row in rows), key=lambda message: message.sequence)
