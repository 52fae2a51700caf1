"""`CronRecords`: schedules made over HTTP (the LangGraph API's crons), kept in the database.

The definition of each is a `workers.schedules.Schedule` in its JSON form, stored as it is
and fired by the same code as the schedules of `AGENT_RUNNER_SCHEDULES`; this table adds
what a schedule made by a client has besides: its owner, its thread, the request that
made it, whether it is enabled and when it ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_runner.ids import utcnow
from store._backend import SqlBackend
from store._engine import AnyRow, translated_errors
from store.schema import crons


@dataclass(frozen=True)
class CronRecord:
    """A stored cron.

    Attributes:
        cron_id: Its id (also the schedule's name).
        tenant_id: The owning tenant (None on a single-tenant server).
        thread_id: The thread its runs go to, as the client knows it (None: a new turn each time).
        assistant_id: The agent it runs.
        schedule: The schedule's JSON form (`Schedule.to_dict()`).
        payload: The request that made it, as the client sent it.
        enabled: Whether it fires.
        end_time: After this it fires no more (None: never ends).
        created_at: When it was made.
        updated_at: When it last changed.
    """

    cron_id: str
    tenant_id: str | None
    thread_id: str | None
    assistant_id: str
    schedule: dict[str, Any]
    payload: dict[str, Any]
    enabled: bool
    end_time: datetime | None
    created_at: datetime
    updated_at: datetime


def _record(row: AnyRow) -> CronRecord:
    return CronRecord(
        cron_id=row.cron_id,
        tenant_id=row.tenant_id,
        thread_id=row.thread_id,
        assistant_id=row.assistant_id,
        schedule=dict(row.schedule),
        payload=dict(row.payload),
        enabled=bool(row.enabled),
        end_time=row.end_time,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


class CronRecords(SqlBackend):
    """Cron records in PostgreSQL or SQLite.

    Args:
        url_or_engine: A database URL or an engine to share.

    Raises:
        StoreUnavailableError: From any method, when the database could not complete the operation.
    """

    def create(
        self,
        cron_id: str,
        *,
        tenant_id: str | None,
        thread_id: str | None,
        assistant_id: str,
        schedule: dict[str, Any],
        payload: dict[str, Any],
        enabled: bool,
        end_time: datetime | None,
    ) -> CronRecord:
        """Store a new cron and return it."""
        now = utcnow()
        values = {
            "cron_id": cron_id,
            "tenant_id": tenant_id,
            "thread_id": thread_id,
            "assistant_id": assistant_id,
            "schedule": schedule,
            "payload": payload,
            "enabled": enabled,
            "end_time": end_time,
            "created_at": now,
            "updated_at": now,
        }
        with translated_errors(self._engine, f"creating cron {cron_id!r}"), self._writer.begin() as connection:
            connection.execute(sa.insert(crons).values(**values))
        return CronRecord(**values)  # type: ignore[arg-type]  # the values above are the record's fields

    def get(self, cron_id: str) -> CronRecord | None:
        """The cron, or None."""
        with translated_errors(self._engine, "reading a cron"), self._engine.connect() as connection:
            row = connection.execute(sa.select(crons).where(crons.c.cron_id == cron_id)).first()
        return None if row is None else _record(row)

    def list(self, tenant_id: str | None = None, *, every_tenant: bool = False) -> list[CronRecord]:
        """The tenant's crons (every tenant's with `every_tenant`), oldest first."""
        statement = sa.select(crons).order_by(crons.c.created_at, crons.c.cron_id)
        if not every_tenant:
            owner = crons.c.tenant_id.is_(None) if tenant_id is None else crons.c.tenant_id == tenant_id
            statement = statement.where(owner)
        with translated_errors(self._engine, "listing crons"), self._engine.connect() as connection:
            return [_record(row) for row in connection.execute(statement)]

    def update(self, cron_id: str, **changes: Any) -> CronRecord | None:
        """Change some of `schedule`, `payload`, `enabled`, `end_time`; None when there is no such cron."""
        allowed = {"schedule", "payload", "enabled", "end_time"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"cannot change {sorted(unknown)} of a cron")
        with translated_errors(self._engine, "updating a cron"), self._writer.begin() as connection:
            done = connection.execute(
                sa.update(crons).where(crons.c.cron_id == cron_id).values(**changes, updated_at=utcnow())
            )
            if done.rowcount != 1:
                return None
            row = connection.execute(sa.select(crons).where(crons.c.cron_id == cron_id)).one()
        return _record(row)

    def delete(self, cron_id: str) -> bool:
        """Delete the cron; False when there was none."""
        with translated_errors(self._engine, "deleting a cron"), self._writer.begin() as connection:
            return int(connection.execute(sa.delete(crons).where(crons.c.cron_id == cron_id)).rowcount) == 1
