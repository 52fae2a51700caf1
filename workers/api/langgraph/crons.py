"""Crons of the LangGraph API: schedules made over HTTP, fired by the same code as `AGENT_RUNNER_SCHEDULES`.

A cron is a `workers.schedules.Schedule` (five cron fields and a time zone) whose
definition is stored in the database (`store.CronRecords`). Each tick starts a turn of the
assistant's agent with the input's user message, owned by the cron's tenant: on the cron's
thread (a run of that thread; `multitask_strategy` `reject` or `enqueue` says what a busy
thread does), or, for a cron made at `/runs/crons`, as a turn of its own outside any
conversation. Every server process runs a scheduler over the stored crons, whatever its
worker mode (`workers.api.runtime`); a tick starts its turn once however many processes
fire it, since the turn id comes from the cron and the tick. A cron fires ticks after its
creation only.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

import store
from agent_runner.ids import new_id, utcnow
from workers.api.auth import RuntimeDep, TenantDep, get_tenant
from workers.api.errors import InvalidRequestError, RecordNotFoundError
from workers.api.langgraph.mapping import NotSupportedError, input_text
from workers.api.langgraph.request_bodies import CronCreate, CronPatch, CronSearch
from workers.api.langgraph.runs import RollbackNotSupportedError
from workers.api.langgraph.threads import RecordsDep, ThreadId, load_thread
from workers.api.openapi import error_responses
from workers.api.runtime import Runtime
from workers.api.tenancy import Tenant
from workers.schedules import Schedule, ScheduleError

logger = logging.getLogger("workers.api")


CronId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:-]{1,100}$", description="A cron id.")]

router = APIRouter(tags=["langgraph"], dependencies=[Depends(get_tenant)], responses=error_responses(404, 413, 501))


def cron_records(runtime: RuntimeDep) -> store.CronRecords:
    """The cron records of the server's database."""
    assert runtime.crons is not None  # made with every runtime
    return runtime.crons


CronsDep = Annotated[store.CronRecords, Depends(cron_records)]


def cron_view(record: store.CronRecord, now: datetime | None = None) -> dict[str, Any]:
    """The `Cron` object."""
    schedule = record.schedule
    next_run = None
    if record.enabled:
        try:
            upcoming = Schedule.from_dict(schedule).next_run(now or utcnow())
        except ScheduleError:
            upcoming = None
        if upcoming is not None and (record.end_time is None or upcoming < record.end_time):
            next_run = upcoming.isoformat()
    return {
        "cron_id": record.cron_id,
        "assistant_id": record.assistant_id,
        "thread_id": record.thread_id,
        "on_run_completed": None,
        "end_time": None if record.end_time is None else record.end_time.isoformat(),
        "schedule": schedule.get("cron"),
        "timezone": schedule.get("timezone"),
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "payload": record.payload,
        "user_id": None,
        "next_run_date": next_run,
        "metadata": record.payload.get("metadata") or {},
        "enabled": record.enabled,
    }


def _end_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
        if moment is not None and moment.tzinfo is not None:
            return moment
    raise InvalidRequestError("end_time must be an ISO 8601 time with a time zone", path="/end_time")


def create_cron(
    runtime: Runtime,
    tenant: Tenant,
    crons: store.CronRecords,
    thread: store.ThreadRecord | None,
    body: CronCreate,
) -> store.CronRecord:
    """Check and store a cron.

    Raises:
        AgentNotFound: No such assistant (404).
        InvalidRequestError: The schedule, time zone, input or end time cannot be used (422).
        NotSupportedError: An option crons do not offer (501).
    """
    if body.multitask_strategy == "rollback":
        raise RollbackNotSupportedError("/multitask_strategy")
    if body.multitask_strategy in ("interrupt", "steer"):
        raise NotSupportedError(f"multitask_strategy={body.multitask_strategy} for crons (reject or enqueue)")
    if body.multitask_strategy == "enqueue" and thread is None:
        raise InvalidRequestError("multitask_strategy=enqueue needs a thread", path="/multitask_strategy")
    for name in ("interrupt_before", "interrupt_after", "webhook", "on_run_completed", "command"):
        if getattr(body, name) not in (None, [], {}):
            raise NotSupportedError(f"the cron option {name}")
    runtime.agent_loader.load(body.assistant_id)
    text = input_text(body.input, [])
    cron_id = new_id()
    try:
        schedule = Schedule(
            name=cron_id,
            agent_id=body.assistant_id,
            input=text,
            cron=body.schedule,
            timezone=body.timezone or "UTC",
            conversation_id=None if thread is None else thread.conversation_id,
            if_busy=body.multitask_strategy,
            metadata={**body.metadata, "cron_id": cron_id},
            tenant_id=tenant.id,
        )
    except ScheduleError as exc:
        raise InvalidRequestError(str(exc).replace(f"schedule {cron_id!r}: ", ""), path="/schedule") from None
    return crons.create(
        cron_id,
        tenant_id=tenant.id,
        thread_id=None if thread is None else thread.thread_id,
        assistant_id=body.assistant_id,
        schedule=schedule.to_dict(),
        payload=body.model_dump(mode="json", exclude_none=True),
        enabled=body.enabled,
        end_time=_end_time(body.end_time),
    )


def _own(crons: store.CronRecords, tenant: Tenant, cron_id: str) -> store.CronRecord:
    record = crons.get(cron_id)
    if record is None or record.tenant_id != tenant.id:
        raise RecordNotFoundError("cron", cron_id)
    return record


def _woken(runtime: Runtime) -> None:
    if runtime.cron_scheduler is not None:
        runtime.cron_scheduler.wake()


@router.post("/threads/{thread_id}/runs/crons", summary="Create a cron on a thread")
async def create_on_thread(
    request: Request,
    thread_id: ThreadId,
    body: CronCreate,
    runtime: RuntimeDep,
    tenant: TenantDep,
    records: RecordsDep,
    crons: CronsDep,
) -> JSONResponse:
    """Start a run on the thread at every tick of the cron `schedule` (five fields, in `timezone`)."""

    def act() -> dict[str, Any]:
        thread = load_thread(records, tenant, thread_id)
        return cron_view(create_cron(runtime, tenant, crons, thread, body))

    view = await run_in_threadpool(act)
    _woken(runtime)
    return JSONResponse(view)


@router.post("/runs/crons", summary="Create a cron")
async def create(
    request: Request, body: CronCreate, runtime: RuntimeDep, tenant: TenantDep, crons: CronsDep
) -> JSONResponse:
    """Start a turn of the assistant at every tick, outside any thread."""
    view = await run_in_threadpool(lambda: cron_view(create_cron(runtime, tenant, crons, None, body)))
    _woken(runtime)
    return JSONResponse(view)


def _matching(crons: store.CronRecords, tenant: Tenant, body: CronSearch) -> list[store.CronRecord]:
    if body.sort_by not in (None, "created_at") or body.sort_order not in (None, "asc"):
        raise NotSupportedError("sorting crons other than by created_at, oldest first")
    return [
        record
        for record in crons.list(tenant.id)
        if (body.assistant_id is None or record.assistant_id == body.assistant_id)
        and (body.thread_id is None or record.thread_id == body.thread_id)
        and (body.enabled is None or record.enabled == body.enabled)
    ]


@router.post("/runs/crons/search", summary="Search crons")
async def search(body: CronSearch, tenant: TenantDep, crons: CronsDep) -> JSONResponse:
    """The tenant's crons, oldest first, filtered by assistant, thread and `enabled`."""
    found = await run_in_threadpool(_matching, crons, tenant, body)
    return JSONResponse([cron_view(record) for record in found[body.offset : body.offset + body.limit]])


@router.post("/runs/crons/count", summary="Count crons")
async def count(body: CronSearch, tenant: TenantDep, crons: CronsDep) -> JSONResponse:
    """How many of the tenant's crons match."""
    return JSONResponse(len(await run_in_threadpool(_matching, crons, tenant, body)))


@router.patch("/runs/crons/{cron_id}", summary="Enable or disable a cron")
async def update(
    cron_id: CronId, body: CronPatch, runtime: RuntimeDep, tenant: TenantDep, crons: CronsDep
) -> JSONResponse:
    """Only `enabled` can change; anything else is a 501. A body without `enabled` answers the cron as it is."""
    unsupported = sorted(body.model_fields_set - {"enabled"})
    if unsupported:
        raise NotSupportedError(f"changing {', '.join(unsupported)} of a cron (delete it and create another)")
    enabled = body.enabled

    def act() -> dict[str, Any]:
        owned = _own(crons, tenant, cron_id)
        if enabled is None:
            return cron_view(owned)
        record = crons.update(cron_id, enabled=enabled)
        if record is None:
            raise RecordNotFoundError("cron", cron_id)
        return cron_view(record)

    view = await run_in_threadpool(act)
    _woken(runtime)
    return JSONResponse(view)


@router.delete("/runs/crons/{cron_id}", summary="Delete a cron", status_code=204)
async def delete(cron_id: CronId, runtime: RuntimeDep, tenant: TenantDep, crons: CronsDep) -> Response:
    """Delete the cron: no tick fires after this; the runs it started stay."""

    def act() -> None:
        _own(crons, tenant, cron_id)
        crons.delete(cron_id)

    await run_in_threadpool(act)
    _woken(runtime)
    return Response(status_code=204)
