"""The backends behind the HTTP server, one set per worker mode, and the threads it runs.

- `embedded`: an `AgentRunner` on the SQL store with an `AgentWorker` stepping turns on
  threads of the server process (SQL leases; SQLite migrates itself) and sweeping the
  deadlines of approvals and forms (beat does it for Celery deployments), and an inbox
  pump that starts queued messages when their conversation frees.
- `celery`: the Celery wiring of `workers.wiring` (dispatching runner, Redis guard,
  broker); the Celery workers step turns and `dispatch_inbox` starts queued messages.
- `none`: the SQL store and the inbox pump only; turns are stepped elsewhere.

Every mode also purges old idempotency keys once an hour.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, text

import store
from agent_runner import AgentEvent, AgentLoader, AgentRunner, AgentRunnerError, EventFeed, InMemoryLiveEvents
from agent_runner.worker import AgentWorker
from workers.agents import apply_runner_setup, load_agent_loader
from workers.api.fanout import EventFanout
from workers.api.settings import ApiSettings, WorkerMode
from workers.database import open_database
from workers.inbox import settle_stale_claims, start_next_message
from workers.telemetry import instrument

logger = logging.getLogger("workers.api")

INBOX_SWEEP_INTERVAL_S = 2.0
"""How often the inbox pump looks for idle conversations with queued messages it was not told about."""

PURGE_INTERVAL_S = 3600.0

STREAM_FOLLOWERS = 256
"""Turn trees and conversations the SSE streams can follow through shared followers at once (a thread each)."""

_STALE_INBOX_CLAIM = timedelta(seconds=60)


class InboxPump:
    """Starts queued inbox messages on a background thread (embedded and `none` modes).

    It is told about conversations whose turn ended (`on_event`, a runner listener) and
    about messages queued while their conversation was free (`notify`); a sweep every
    `interval` seconds catches the rest (turns ended in other processes, a restart).

    Args:
        runner: Starts the turns.
        inbox: The queues.
        default_agent: Agent for messages queued without one (`AGENT_RUNNER_INBOX_AGENT`).
        interval: Seconds between sweeps.
    """

    def __init__(self, runner: AgentRunner, inbox: store.Inbox, default_agent: str | None, interval: float) -> None:
        self.runner = runner
        self.inbox = inbox
        self.default_agent = default_agent
        self.interval = interval
        self._pending: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def on_event(self, event: AgentEvent) -> None:
        """Runner listener: a conversation turn ended, so its next message may start."""
        if event.type.is_terminal and event.conversation_id is not None:
            self.notify(event.conversation_id)

    def notify(self, conversation_id: str) -> None:
        """Try to start the conversation's next message soon."""
        self._pending.put(conversation_id)

    def start(self) -> None:
        """Start the pump thread."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="agent-runner-inbox", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the pump thread."""
        self._stopping.set()
        self._pending.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conversation = self._pending.get(timeout=self.interval)
            except queue.Empty:
                conversation = None
                self._guarded(self.sweep)
            if conversation is not None:
                self._guarded(self.serve, conversation)

    def _guarded(self, action: Callable[..., object], *args: Any) -> None:
        try:
            action(*args)
        except Exception:
            logger.exception("the inbox pump failed; it tries again at the next sweep")

    def serve(self, conversation_id: str) -> None:
        """Start the conversation's next message if it is free."""
        start_next_message(self.runner, self.inbox, self.default_agent, conversation_id, ask_again=self.notify)

    def sweep(self) -> None:
        """Settle claims of a server that died mid-start, then serve every idle conversation with a message."""
        settle_stale_claims(self.runner, self.inbox, self.runner.clock() - _STALE_INBOX_CLAIM)
        for conversation_id in self.inbox.conversations_ready():
            self.serve(conversation_id)


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
    """

    settings: ApiSettings
    runner: AgentRunner
    turn_store: store.SqlAgentTurnStore
    memories: store.SqlChatMemoryProvider
    inbox: store.Inbox
    idempotency: store.IdempotencyKeys
    engine: Engine
    wake_inbox: Callable[[str], object]
    events: EventFeed
    fanout: EventFanout
    checks: dict[str, Callable[[], None]] = field(default_factory=dict)
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
        return _celery_runtime(settings, agent_loader)
    return _sql_runtime(settings, agent_loader)


def _database_check(engine: Engine) -> Callable[[], None]:
    def check() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    return check


def _sql_runtime(settings: ApiSettings, agent_loader: AgentLoader | None) -> Runtime:
    worker_settings = settings.workers
    loader = agent_loader if agent_loader is not None else load_agent_loader(worker_settings.agent_loader)
    database = open_database(worker_settings.database_url)
    try:
        idempotency = store.IdempotencyKeys(database.engine)
    except BaseException:
        database.close()
        raise
    runner = AgentRunner(
        turn_store=database.turn_store,
        agent_loader=loader,
        chat_memory_provider=database.memories,
        policy=worker_settings.policy(),
    )
    instrument(runner)  # spans, metrics and log context of the steps this process runs
    apply_runner_setup(runner, worker_settings.runner_setup)
    pump = InboxPump(runner, database.inbox, worker_settings.inbox_agent, INBOX_SWEEP_INTERVAL_S)
    runner.add_event_listener(pump.on_event)
    # The steps run in this process, so its events reach SSE subscribers in-process; in
    # `none` mode they are the events of what this process does (starts, cancels).
    live = InMemoryLiveEvents()
    runner.add_event_listener(live.publish)
    feed = EventFeed(database.turn_store, live)
    runtime = Runtime(
        settings=settings,
        runner=runner,
        turn_store=database.turn_store,
        memories=database.memories,
        inbox=database.inbox,
        idempotency=idempotency,
        engine=database.engine,
        wake_inbox=pump.notify,
        events=feed,
        fanout=EventFanout(feed, max_scopes=STREAM_FOLLOWERS),
        checks={"database": _database_check(database.engine)},
    )
    # Stopped in reverse: the pump, then the worker (its steps in flight finish), then the pool.
    runtime._stops.append(database.close)
    if settings.worker_mode is WorkerMode.EMBEDDED:
        worker = AgentWorker(
            runner,
            lease=store.SqlTurnLease(database.engine),
            concurrency=settings.worker_concurrency,
            lease_ttl=worker_settings.lease_ttl_s,
            # No beat here: the worker applies approval and form deadlines itself.
            deadline_interval=worker_settings.deadline_sweep_interval_s,
        )
        runtime._starts.append(worker.start)
        runtime._stops.append(lambda: _stop_worker(worker))
    runtime._starts.append(pump.start)
    runtime._stops.append(pump.stop)
    runtime._stops.append(runtime.fanout.close)  # stopped first: its threads read through the store
    return runtime


def _stop_worker(worker: AgentWorker) -> None:
    if not worker.stop(timeout=30.0):
        logger.warning("the embedded worker still had steps in flight after 30 s; their leases expire")


def _celery_runtime(settings: ApiSettings, agent_loader: AgentLoader | None) -> Runtime:
    # The only place the HTTP server touches the Celery wiring.
    from workers.app import create_app
    from workers.wiring import build_wiring

    worker_settings = settings.workers
    # A producer sends tasks by name: an app of its own, configured from the server's settings.
    celery_app: Any = create_app(worker_settings)
    wiring = build_wiring(worker_settings, celery_app, agent_loader=agent_loader)
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
        wiring.guard.holder("agent-runner-readiness-probe")

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
