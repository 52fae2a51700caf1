"""The backends behind the HTTP server, one set per worker mode, and the threads it runs.

- `embedded`: the embedded deployment of `workers.embedded`, as `agent-runner worker` runs
  it: an `AgentWorker` stepping turns on threads of the server process (SQL leases; SQLite
  migrates itself) and sweeping the deadlines of approvals and forms, an inbox pump that
  starts queued messages when their conversation frees, the webhook deliverer, and a
  `Scheduler` firing the scheduled turns of `AGENT_RUNNER_SCHEDULES` (beat does the
  sweeping and firing for Celery deployments).
- `celery`: the Celery wiring of `workers.wiring` (dispatching runner, Redis guard,
  broker); the Celery workers step turns and `dispatch_inbox` starts queued messages.
- `none`: the SQL store and the inbox pump only; turns are stepped elsewhere, and the
  scheduled turns are fired where they are stepped (`agent-runner worker`, or beat).

Every mode also purges old idempotency keys once an hour.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, text
from starlette.concurrency import run_in_threadpool

import store
from agent_runner import AgentLoader, AgentRunner, AgentRunnerError, EventFeed, InMemoryLiveEvents
from agent_runner.persistence import ConversationKey
from workers.agents import load_agent_loader
from workers.api.fanout import EventFanout
from workers.api.server_settings import ApiSettings, WorkerMode
from workers.capacity import server_database_pool
from workers.database import open_database
from workers.embedded import Stepping, build_embedded
from workers.live import attach_live

if TYPE_CHECKING:
    from workers.embedded_timers import Scheduler

logger = logging.getLogger("workers.api")

PURGE_INTERVAL_S = 3600.0

STREAM_FOLLOWERS = 256
"""Turn trees and conversations the SSE streams can follow through shared followers at once (a thread each)."""


@dataclass
class Runtime:
    """What the routes use: the runner and the stores, plus the threads of the mode.

    Attributes:
        settings: The server's settings.
        runner: Starts, resumes and cancels turns (enqueueing them in `celery` mode).
        turn_store: The SQL turn store.
        memories: The SQL chat memories.
        inbox: The inbox of queued messages.
        idempotency: The idempotency keys of POST requests.
        engine: The database engine all of them share.
        wake_inbox: Asks for a conversation's next queued message to be started.
        events: The event feed of the SSE routes (durable log plus live channel).
        fanout: The followers of the feed the SSE streams share, one per scope.
        threads: The records of conversations managed as threads (the LangGraph API).
        crons: The schedules made over HTTP (the LangGraph API's crons).
        cron_scheduler: Fires `crons` from this process; `wake()` it after a change.
    """

    settings: ApiSettings
    runner: AgentRunner
    turn_store: store.SqlAgentTurnStore
    memories: store.SqlChatMemoryProvider
    inbox: store.Inbox
    idempotency: store.IdempotencyKeys
    engine: Engine
    wake_inbox: Callable[[ConversationKey], object]
    events: EventFeed
    fanout: EventFanout
    checks: dict[str, Callable[[], None]] = field(default_factory=dict)
    threads: store.ThreadRecords | None = None
    crons: store.CronRecords | None = None
    cron_scheduler: Scheduler | None = None
    _starts: list[Callable[[], None]] = field(default_factory=list)
    _stops: list[Callable[[], None]] = field(default_factory=list)
    _purger: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def agent_loader(self) -> AgentLoader:
        """The agents of the server."""
        return self.runner.agent_loader

    def start(self) -> None:
        """Start the threads of the mode (worker, inbox pump, key purge)."""
        for action in self._starts:
            action()
        self._stopping.clear()
        self._purger = threading.Thread(target=self._purge_loop, name="agent-runner-purge", daemon=True)
        self._purger.start()

    def stop(self) -> None:
        """Stop the threads (steps in flight finish first) and close the connections."""
        self._stopping.set()
        for action in reversed(self._stops):
            try:
                action()
            except Exception:
                logger.exception("stopping the server's backends failed")

    def readiness(self) -> dict[str, str | None]:
        """Check each dependency: name -> None when it answered, else why not."""
        results: dict[str, str | None] = {}
        for name, check in self.checks.items():
            try:
                check()
                results[name] = None
            except Exception as exc:
                results[name] = f"{type(exc).__name__}: {exc}"
        return results

    def _purge_loop(self) -> None:
        ttl = timedelta(seconds=self.settings.idempotency_ttl_s)
        while True:
            try:
                removed = self.idempotency.purge(self.runner.clock() - ttl)
                if removed:
                    logger.info("purged %d idempotency keys older than %s", removed, ttl)
            except AgentRunnerError as exc:
                logger.warning("purging idempotency keys failed: %s", exc)
            if self._stopping.wait(PURGE_INTERVAL_S):
                return


def build_runtime(settings: ApiSettings, agent_loader: AgentLoader | None = None) -> Runtime:
    """Build the backends of `settings.worker_mode`.

    Raises:
        SettingsError: The agents or another setting cannot be used.
        StoreUnavailableError: The database could not be reached.
    """
    if settings.worker_mode is WorkerMode.CELERY:
        runtime = _celery_runtime(settings, agent_loader)
    else:
        runtime = _sql_runtime(settings, agent_loader)
    _add_client_records(runtime)
    return runtime


STORED_SCHEDULES_POLL = timedelta(seconds=5)
"""How soon a server notices a schedule another process stored (the one that stored it checks at once)."""


def _add_client_records(runtime: Runtime) -> None:
    """Threads and crons of the LangGraph API; every server process fires the stored crons, whatever its mode.

    A tick starts its turn once however many processes fire it (the turn id comes from the
    schedule and the tick). No start-up grace: a schedule fires the ticks after it was seen,
    never one from before it was made.
    """
    from workers.embedded_timers import Scheduler
    from workers.schedules import stored_schedules

    runtime.threads = store.ThreadRecords(runtime.engine)
    crons = runtime.crons = store.CronRecords(runtime.engine)
    scheduler = runtime.cron_scheduler = Scheduler(
        runtime.runner,
        runtime.inbox,
        lambda: stored_schedules(crons),
        notify_inbox=runtime.wake_inbox,
        startup_grace=timedelta(0),
        poll=STORED_SCHEDULES_POLL,
    )
    runtime._starts.append(scheduler.start)
    runtime._stops.append(lambda: _stop_scheduler(scheduler))  # stops run in reverse: this one first


def _database_check(engine: Engine) -> Callable[[], None]:
    def check() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    return check


def _sql_runtime(settings: ApiSettings, agent_loader: AgentLoader | None) -> Runtime:
    worker_settings = settings.workers
    loader = agent_loader if agent_loader is not None else load_agent_loader(worker_settings.agent_loader)
    stepping = Stepping(settings.worker_concurrency) if settings.worker_mode is WorkerMode.EMBEDDED else None
    threads = settings.worker_concurrency if stepping is not None else 0
    pool = server_database_pool(worker_settings, threads)
    database = open_database(worker_settings.database_url, pool, coalesce_inbox=worker_settings.inbox_coalesce)
    try:
        idempotency = store.IdempotencyKeys(database.engine)
        embedded = build_embedded(worker_settings, database, loader, stepping)
    except BaseException:
        database.close()
        raise
    runner = embedded.runner
    # The steps run in this process, so its events reach SSE subscribers in-process; in
    # `none` mode they are the events of what this process does (starts, cancels).
    live = InMemoryLiveEvents()
    attach_live(runner, live.publish)
    feed = EventFeed(database.turn_store, live)
    runtime = Runtime(
        settings=settings,
        runner=runner,
        turn_store=database.turn_store,
        memories=database.memories,
        inbox=database.inbox,
        idempotency=idempotency,
        engine=database.engine,
        wake_inbox=embedded.pump.notify,
        events=feed,
        fanout=EventFanout(feed, max_scopes=STREAM_FOLLOWERS),
        checks={"database": _database_check(database.engine)},
    )
    # Stopped in reverse: the fanout (its threads read through the store), the embedded
    # deployment (its steps in flight finish), then the pool.
    runtime._stops.append(database.close)
    runtime._starts.append(embedded.start)
    runtime._stops.append(embedded.stop)
    runtime._stops.append(runtime.fanout.close)
    return runtime


def _stop_scheduler(scheduler: Scheduler) -> None:
    if not scheduler.stop(timeout=10.0):
        logger.warning("the scheduler was still firing a tick after 10 s; the server stops without it")


def _celery_runtime(settings: ApiSettings, agent_loader: AgentLoader | None) -> Runtime:
    # The only place the HTTP server touches the Celery wiring.
    from workers.celery_app.config import create_app
    from workers.wiring import build_wiring

    worker_settings = settings.workers
    # A producer sends tasks by name: an app of its own, configured from the server's settings.
    celery_app: Any = create_app(worker_settings)
    # A request saves the turn and only queues its step message: a thread sends the queued
    # messages in batches, and a message lost with the process is re-sent by the sweeps.
    wiring = build_wiring(
        worker_settings,
        celery_app,
        agent_loader=agent_loader,
        background_dispatch=True,
        pool=server_database_pool(worker_settings),
    )
    try:
        idempotency = store.IdempotencyKeys(wiring.engine)
    except BaseException:
        wiring.close()
        raise
    # The wiring publishes the events of what this process does (starts, resumes, cancels)
    # to the live channel, like the workers do for the steps.
    live = wiring.live
    runner = wiring.runner
    memories = runner.chat_memory_provider
    assert isinstance(memories, store.SqlChatMemoryProvider)
    dispatcher = wiring.dispatcher
    feed = EventFeed(wiring.turn_store, live)

    def check_redis() -> None:
        wiring.guard.holder(ConversationKey("agent-runner-readiness-probe"))

    def check_broker() -> None:
        with celery_app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=3)

    runtime = Runtime(
        settings=settings,
        runner=runner,
        turn_store=wiring.turn_store,
        memories=memories,
        inbox=wiring.inbox,
        idempotency=idempotency,
        engine=wiring.engine,
        wake_inbox=dispatcher.send_inbox,
        events=feed,
        fanout=EventFanout(feed, max_scopes=STREAM_FOLLOWERS),
        checks={"database": _database_check(wiring.engine), "redis": check_redis, "broker": check_broker},
    )
    runtime._stops.append(wiring.close)
    runtime._stops.append(runtime.fanout.close)  # stopped first: its threads read through the wiring
    return runtime


class RuntimeHandle:
    """The runtime of one API application: started by the application's lifespan, or on first use without one.

    An application mounted inside another (`host.mount("/agents", create_app())`) never
    gets its own lifespan (the host's server sends it to the host only). Its first request
    then builds and starts the runtime, says so in the log (with the hook that starts it
    with the host instead), and the runtime stops when the process exits. A runtime that
    cannot be built answers that request with a 503 naming why, and the next request tries
    again.

    Args:
        settings: The server's settings.
        agents: The agents (default: `AGENT_RUNNER_AGENT_LOADER`).
    """

    def __init__(self, settings: ApiSettings, agents: AgentLoader | None = None) -> None:
        self.settings = settings
        self._agents = agents
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether the runtime is running."""
        return self._runtime is not None

    def get(self) -> Runtime:
        """The running runtime, started now if nothing started it (see the class docstring).

        Raises:
            RuntimeUnavailableError: The runtime could not be built (the database is down,
                the agents cannot be loaded).
        """
        runtime = self._runtime
        if runtime is not None:
            return runtime
        with self._lock:
            if self._runtime is None:
                logger.warning(
                    "the agent-runner API was not started by its application's lifespan (mounted inside another "
                    "app?); starting its runtime on first use. To start and stop it with the host, create the host "
                    "with `FastAPI(lifespan=runtime_handle(agents_app).lifespan)`, or add the routes with "
                    "`include_api(host)` instead of mounting (docs/http-api.md)"
                )
                self._runtime = self._build_and_start()
                atexit.register(self.stop)
            return self._runtime

    def start(self) -> Runtime:
        """Build and start the runtime (once; later calls return the running one)."""
        with self._lock:
            if self._runtime is None:
                self._runtime = self._build_and_start()
            return self._runtime

    def stop(self) -> None:
        """Stop the runtime if it runs (its threads finish their steps); it can be started again."""
        with self._lock:
            runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.stop()

    @asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """Start the runtime with an application and stop it after: pass it as `FastAPI(lifespan=...)`."""
        await run_in_threadpool(self.start)
        try:
            yield
        finally:
            await run_in_threadpool(self.stop)

    def _build_and_start(self) -> Runtime:
        try:
            runtime = build_runtime(self.settings, self._agents)
        except Exception as exc:
            # Whatever failed (settings, database, broker), requests get a 503 that names it.
            logger.error("the agent-runner runtime could not start: %s: %s", type(exc).__name__, exc)
            raise RuntimeUnavailableError(f"{type(exc).__name__}: {exc}") from exc
        runtime.start()
        return runtime


class RuntimeUnavailableError(AgentRunnerError):
    """The server's runtime (stores, worker) could not be built; requests get a 503 until it can."""

    retryable = True

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the agent-runner runtime could not start: {reason}")
