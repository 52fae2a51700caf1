"""Builds the runner and its backends from `WorkerSettings`, once per process.

A worker process gets one `ProcessBackends` (SQL store, chat memory, inbox, Redis lease and guard,
agent loader, and a runner whose dispatcher sends Celery messages), built lazily on first
use. Lazily matters: Celery's prefork pool forks its children after the app is imported,
and a database connection pool or Redis socket inherited across a fork would be shared by
two processes.

Nothing here reads the environment at import: `build_wiring` takes explicit settings; a
worker process's wiring is built by `workers.celery_app.process.current()` from the
settings of the app it serves, a producer's by `workers.producer.build_runner`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

import store
from agent_runner import AgentLoader, AgentRunner, Middleware
from agent_runner.leasing import LeaseKeeper
from store.redis_events import BackgroundPublisher
from workers.agents import apply_runner_setup, load_agent_loader
from workers.capacity import PoolSize, database_pool
from workers.celery_app.admission import TurnAdmission, build_admission
from workers.celery_app.dispatch import CeleryDispatcher, InboxNotifier
from workers.celery_app.outbox import MessageOutbox
from workers.database import open_database
from workers.live import attach_live
from workers.settings import WorkerSettings
from workers.telemetry import instrument

logger = logging.getLogger("workers")


# --- ProcessBackends -----------------------------------------------------------------------------------


@dataclass
class ProcessBackends:
    """Everything a worker process (or a web app) needs to run or enqueue turns."""

    settings: WorkerSettings
    celery_app: Any
    runner: AgentRunner
    turn_store: store.SqlAgentTurnStore
    inbox: store.Inbox
    lease: store.RedisTurnLease
    guard: store.RedisConversationGuard
    dispatcher: CeleryDispatcher
    keeper: LeaseKeeper
    live: store.RedisLiveEvents
    """The live event channel every event of this process's runner is published to."""
    engine: Engine = field(repr=False)
    publisher: BackgroundPublisher | None = field(default=None, repr=False)
    """Sends the runner's events to `live` from a thread of its own."""
    limiter: store.RedisModelLimiter | None = field(default=None, repr=False)
    """The fleet's shared model limits (`AGENT_RUNNER_MODEL_LIMITS`), when any are set."""
    admission: TurnAdmission | None = field(default=None, repr=False)
    """Fair admission of new turns (`AGENT_RUNNER_ADMISSION_WINDOW`), when it is on."""

    def close(self) -> None:
        """Send the messages and events still queued, then close the Redis clients and the database pool."""
        if self.dispatcher.outbox is not None:
            self.dispatcher.outbox.close()
        if self.publisher is not None:
            self.publisher.close()
        self.turn_store.close()
        self.live.close()
        self.lease.close()
        self.guard.close()
        if self.limiter is not None:
            self.limiter.close()
        if self.admission is not None:
            self.admission.close()
        self.engine.dispose()


def build_wiring(
    settings: WorkerSettings,
    celery_app: Any,
    *,
    agent_loader: AgentLoader | None = None,
    middleware: Iterable[Middleware] = (),
    tasks_in_flight: int = 1,
    background_dispatch: bool = False,
    pool: PoolSize | None = None,
) -> ProcessBackends:
    """Build the backends and a dispatching runner from `settings`.

    Args:
        settings: Where the database and Redis are, and how to dispatch.
        celery_app: The app whose broker receives the step messages.
        agent_loader: The agents (default: resolved from `settings.agent_loader`).
        middleware: Middleware of the runner, outermost first.
        tasks_in_flight: Tasks of this process that use the wiring at once (the threads of a
            thread pool); sizes the database pool unless the settings fix it.
        background_dispatch: Send the dispatcher's messages from a thread of their own,
            several per round trip (`MessageOutbox`), instead of in the thread that saves
            the turn; `ProcessBackends.close` sends what is still queued.
        pool: The database pool (default: sized from `tasks_in_flight`, see
            `workers.capacity.database_pool`).

    Raises:
        SettingsError: The agent loader or the runner set-up (`AGENT_RUNNER_SETUP`) cannot be resolved.
        SchemaVersionError: The database's tables are missing or at another schema revision
            than this code needs; the message names `agent-runner db upgrade`.
        StoreUnavailableError: The database could not be reached to check its schema.
    """
    loader = agent_loader if agent_loader is not None else load_agent_loader(settings.agent_loader)
    pool = pool or database_pool(settings, tasks_in_flight)
    database = open_database(settings.database_url, pool, coalesce_inbox=settings.inbox_coalesce)
    lease = store.RedisTurnLease(settings.redis_url, prefix=settings.redis_prefix)
    guard = store.RedisConversationGuard(settings.redis_url, prefix=settings.redis_prefix)
    outbox = MessageOutbox(celery_app) if background_dispatch else None
    dispatcher = CeleryDispatcher(celery_app, settings, outbox=outbox)
    admission = build_admission(settings, dispatcher.send_step)
    dispatcher.admission = admission
    limiter = model_limiter(settings)
    runner = AgentRunner(
        turn_store=database.turn_store,
        agent_loader=loader,
        chat_memory_provider=database.memories,
        policy=settings.policy(),
        middleware=list(middleware),
        dispatcher=dispatcher,
        conversation_guard=guard,
        model_limiter=limiter,
    )
    instrument(runner)  # spans, metrics and log context of every step
    # Every event leaves the process: deltas and progress live only, durable events as a
    # wake-up for followers (they are read from the store). A thread of their own sends
    # them, so a step never waits for Redis (several steps' events often share a round trip).
    live = store.RedisLiveEvents(settings.redis_url, prefix=settings.redis_prefix)
    publisher = BackgroundPublisher(live)
    attach_live(runner, publisher)
    if admission is not None:
        admission.announce = publisher  # a turn that waits for admission says its place, live
    # A turn that ends frees its conversation for the next queued message (queued messages
    # name their agent, or fall back to AGENT_RUNNER_INBOX_AGENT).
    runner.add_event_listener(InboxNotifier(dispatcher, database.inbox.has_waiting))
    if admission is not None:
        # A turn that ends or waits frees its place under the tenant's cap for the next one.
        runner.add_event_listener(admission)
    apply_runner_setup(runner, settings.runner_setup)
    return ProcessBackends(
        settings=settings,
        celery_app=celery_app,
        runner=runner,
        turn_store=database.turn_store,
        inbox=database.inbox,
        lease=lease,
        guard=guard,
        dispatcher=dispatcher,
        keeper=LeaseKeeper(lease, settings.lease_ttl_ms, name=f"celery worker {os.getpid()}"),
        live=live,
        engine=database.engine,
        publisher=publisher,
        limiter=limiter,
        admission=admission,
    )


def model_limiter(settings: WorkerSettings) -> store.RedisModelLimiter | None:
    """The limiter of `AGENT_RUNNER_MODEL_LIMITS` in the deployment's Redis, shared by every process; None without limits."""
    if not settings.model_limits:
        return None
    return store.RedisModelLimiter(
        settings.model_limits,
        settings.redis_url,
        prefix=settings.redis_prefix,
        tenant_weights=settings.model_tenant_weights,
    )
