"""Builds the runner and its backends from `WorkerSettings`, once per process.

A worker process gets one `Wiring` (SQL store, chat memory, inbox, Redis lease and guard,
agent loader, and a runner whose dispatcher sends Celery messages), built lazily on first
use. Lazily matters: Celery's prefork pool forks its children after the app is imported,
and a database connection pool or Redis socket inherited across a fork would be shared by
two processes.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import Engine

import store
from agent_runner import (
    Agent,
    AgentEvent,
    AgentLoader,
    AgentRunner,
    AgentRunnerError,
    AgentTurn,
    AgentTurnStatus,
    InMemoryAgentLoader,
    Lease,
    Middleware,
    RecoverableError,
    ToolCall,
    TurnLease,
)
from agent_runner._base import utcnow
from agent_runner.models import ChatRequest, ChatResponse
from workers.app import DISPATCH_INBOX, STEP_TURN
from workers.settings import SettingsError, WorkerSettings
from workers.telemetry import instrument  # telemetry hook

logger = logging.getLogger("workers")

LOADER_VARIABLE = "AGENT_RUNNER_AGENT_LOADER"


# --- Agents -----------------------------------------------------------------------------------


def load_agent_loader(spec: str | None) -> AgentLoader:
    """Resolve `module:attribute` to an `AgentLoader`; an empty in-memory loader when `spec` is None.

    The attribute may be an `AgentLoader`, an `Agent`, a list of `Agent`s, or a function
    (or class) called without arguments that returns one of those.

    Raises:
        SettingsError: The module or attribute cannot be imported, or is none of the above.
    """
    if spec is None:
        return InMemoryAgentLoader()
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SettingsError(LOADER_VARIABLE, spec, f"cannot import module {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise SettingsError(LOADER_VARIABLE, spec, f"{module_name!r} has no attribute {attribute!r}") from None
    return _as_loader(target, spec, call=True)


def _as_loader(target: Any, spec: str, *, call: bool) -> AgentLoader:
    if isinstance(target, Agent):
        return InMemoryAgentLoader([target])
    if isinstance(target, list | tuple) and target and all(isinstance(item, Agent) for item in target):
        return InMemoryAgentLoader(target)
    # A class has a `load` attribute too: only an instance is a loader.
    if not isinstance(target, type) and isinstance(target, AgentLoader):
        return target
    if call and callable(target):
        try:
            made = target()
        except Exception as exc:
            raise SettingsError(LOADER_VARIABLE, spec, f"calling it raised {type(exc).__name__}: {exc}") from exc
        return _as_loader(made, spec, call=False)
    raise SettingsError(
        LOADER_VARIABLE, spec, f"expected an AgentLoader, an Agent or a list of Agents, got {type(target).__name__}"
    )


# --- Dispatch ---------------------------------------------------------------------------------


class CeleryDispatcher:
    """A `TurnDispatcher` that sends `step_turn` messages to the Celery queue.

    Duplicates are harmless (`step_turn` is idempotent), so the dispatcher never tries to
    avoid them. A retry wait longer than `max_eta_s` is not sent at all: with the Redis
    broker a message whose ETA lies beyond the visibility timeout is redelivered again and
    again while it waits, so long waits are left to the due-retry sweep, which reads
    `next_retry_at` from the store. A failed publish is logged, not raised: the turn is
    already saved, and the sweeps re-enqueue it.

    Args:
        celery_app: The app whose broker receives the messages.
        settings: Queue name and ETA limit.
        clock: The current UTC time.
    """

    def __init__(self, celery_app: Any, settings: WorkerSettings, clock: Callable[[], datetime] = utcnow) -> None:
        self.celery_app = celery_app
        self.queue = settings.queue
        self.max_eta = timedelta(seconds=settings.max_eta_s)
        self.clock = clock

    def dispatch(self, turn: AgentTurn) -> None:
        """Enqueue a step of `turn` if it is runnable now or is a retry due within the ETA limit."""
        if turn.status is AgentTurnStatus.RETRY_SCHEDULED:
            self.send_step(turn.id, turn.version, eta=turn.next_retry_at)
        elif turn.is_runnable(self.clock()):
            self.send_step(turn.id, turn.version)

    def send_step(self, turn_id: str, version: int, *, eta: datetime | None = None) -> bool:
        """Send `step_turn(turn_id, version)`, delayed until `eta` if it lies ahead; False if not sent."""
        options: dict[str, Any] = {"queue": self.queue}
        if eta is not None:
            now = self.clock()
            if eta - now > self.max_eta:
                logger.debug("turn %s retries at %s, beyond the ETA limit: left to the sweep", turn_id, eta)
                return False
            if eta > now:
                options["eta"] = eta
        return self._send(STEP_TURN, (turn_id, version), options)

    def send_inbox(self, conversation_id: str) -> bool:
        """Send `dispatch_inbox(conversation_id)`; False if not sent."""
        return self._send(DISPATCH_INBOX, (conversation_id,), {"queue": self.queue})

    def _send(self, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> bool:
        try:
            self.celery_app.send_task(name, args=args, **options)
        except Exception:
            logger.exception("could not send %s%r; the sweeps will pick it up", name, args)
            return False
        return True


class InboxNotifier:
    """An event listener that asks for the conversation's next inbox message when a turn ends.

    It only sends a message; it never drives the runner, which is still inside the step
    that emitted the event.
    """

    def __init__(self, dispatcher: CeleryDispatcher) -> None:
        self.dispatcher = dispatcher

    def __call__(self, event: AgentEvent) -> None:
        """Send `dispatch_inbox` for a terminal event of a conversation turn."""
        if event.type.is_terminal and event.conversation_id is not None:
            self.dispatcher.send_inbox(event.conversation_id)


class SoftTimeLimitAsRetry(Middleware):
    """Turns Celery's soft time limit, raised inside a model or tool call, into a retry.

    The limit fires when one call hangs. Without this the runner would see an unknown
    exception and fail the turn for good; a hung call is a transient failure, so the turn
    is retried with backoff like a timeout. The call runs again with the same idempotency
    key.
    """

    def wrap_model(self, request: ChatRequest, call_next: Callable[[ChatRequest], ChatResponse]) -> ChatResponse:
        """Run the model call; a soft time limit becomes a `RecoverableError`."""
        try:
            return call_next(request)
        except SoftTimeLimitExceeded as exc:
            raise RecoverableError("the model call ran past the worker's soft time limit") from exc

    def wrap_tool(self, tool_call: ToolCall, call_next: Callable[[ToolCall], Any]) -> Any:
        """Run the tool call; a soft time limit becomes a `RecoverableError`."""
        try:
            return call_next(tool_call)
        except SoftTimeLimitExceeded as exc:
            raise RecoverableError(f"tool {tool_call.name!r} ran past the worker's soft time limit") from exc


# --- Leases -----------------------------------------------------------------------------------


class LeaseKeeper:
    """Takes turn leases for the tasks of this process and renews them while the steps run.

    A step may outlast the lease TTL (a slow model call). A background thread renews every
    held lease every third of the TTL; a lease it fails to renew is marked lost, and the
    task stops before its next step (any save it still makes is refused by the store's
    fence check). Each acquisition uses a fresh owner token, so two deliveries of the same
    turn in one process (a thread pool) exclude each other like two processes would.

    Args:
        lease: The shared lease backend.
        ttl_ms: Lease time-to-live in milliseconds.
    """

    def __init__(self, lease: TurnLease, ttl_ms: int) -> None:
        self.lease = lease
        self.ttl_ms = ttl_ms
        self._held: dict[str, Lease] = {}
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._owner_prefix = f"{socket.gethostname()}:{os.getpid()}"

    def acquire(self, turn_id: str) -> Lease | None:
        """Take the turn's lease; None when another owner holds it.

        Raises:
            StoreUnavailableError: The lease backend could not be reached.
        """
        owner = f"{self._owner_prefix}:{uuid.uuid4().hex[:12]}"
        lease = self.lease.acquire(turn_id, owner, self.ttl_ms)
        if lease is None:
            return None
        with self._lock:
            self._held[turn_id] = lease
            self._lost.discard(turn_id)
        self._ensure_heartbeat()
        return lease

    def is_lost(self, turn_id: str) -> bool:
        """Whether renewing the turn's lease failed since it was acquired."""
        with self._lock:
            return turn_id in self._lost

    def release(self, lease: Lease) -> None:
        """Give the lease up; a failure is logged (the lease then expires by itself)."""
        with self._lock:
            if self._held.get(lease.turn_id) == lease:
                del self._held[lease.turn_id]
            self._lost.discard(lease.turn_id)
        try:
            self.lease.release(lease)
        except AgentRunnerError as exc:
            logger.warning("releasing the lease of turn %s failed (it will expire): %s", lease.turn_id, exc)

    def _ensure_heartbeat(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._heartbeat, name="agent-runner-lease-heartbeat", daemon=True)
            self._thread.start()

    def _heartbeat(self) -> None:
        interval = self.ttl_ms / 3000
        while not self._wake.wait(interval):
            with self._lock:
                held = list(self._held.values())
            for lease in held:
                try:
                    renewed = self.lease.renew(lease, self.ttl_ms)
                except AgentRunnerError as exc:
                    # Not lost yet: the next beat may reach the backend again in time.
                    logger.warning("renewing the lease of turn %s failed: %s", lease.turn_id, exc)
                    continue
                if not renewed:
                    with self._lock:
                        if self._held.get(lease.turn_id) == lease:
                            self._lost.add(lease.turn_id)
                    logger.warning("lost the lease of turn %s; the task stops after its current step", lease.turn_id)


# --- Wiring -----------------------------------------------------------------------------------


@dataclass
class Wiring:
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
    engine: Engine = field(repr=False)

    def close(self) -> None:
        """Close the Redis clients and the database pool."""
        self.lease.close()
        self.guard.close()
        self.engine.dispose()


def build_wiring(
    settings: WorkerSettings,
    celery_app: Any,
    *,
    agent_loader: AgentLoader | None = None,
    middleware: Iterable[Middleware] = (),
) -> Wiring:
    """Build the backends and a dispatching runner from `settings`.

    Args:
        settings: Where the database and Redis are, and how to dispatch.
        celery_app: The app whose broker receives the step messages.
        agent_loader: The agents (default: resolved from `settings.agent_loader`).
        middleware: Middleware of the runner, outermost first.

    Raises:
        SettingsError: The agent loader cannot be resolved.
        StoreUnavailableError: The database could not be reached to check its schema.
    """
    loader = agent_loader if agent_loader is not None else load_agent_loader(settings.agent_loader)
    engine = store.make_engine(settings.database_url)
    try:
        turn_store = store.SqlAgentTurnStore(engine)
        memories = store.SqlChatMemoryProvider(engine)
        inbox = store.Inbox(engine)
    except BaseException:
        engine.dispose()
        raise
    lease = store.RedisTurnLease(settings.redis_url, prefix=settings.redis_prefix)
    guard = store.RedisConversationGuard(settings.redis_url, prefix=settings.redis_prefix)
    dispatcher = CeleryDispatcher(celery_app, settings)
    runner = AgentRunner(
        turn_store=turn_store,
        agent_loader=loader,
        chat_memory_provider=memories,
        policy=settings.policy(),
        middleware=list(middleware),
        dispatcher=dispatcher,
        conversation_guard=guard,
    )
    instrument(runner)  # telemetry hook: spans, metrics and log context of every step
    if settings.inbox_agent is not None:
        runner.add_event_listener(InboxNotifier(dispatcher))
    return Wiring(
        settings=settings,
        celery_app=celery_app,
        runner=runner,
        turn_store=turn_store,
        inbox=inbox,
        lease=lease,
        guard=guard,
        dispatcher=dispatcher,
        keeper=LeaseKeeper(lease, settings.lease_ttl_ms),
        engine=engine,
    )


_current: tuple[int, Wiring] | None = None
_current_lock = threading.Lock()


def current() -> Wiring:
    """The wiring of this worker process, built on first use from `workers.app`'s settings."""
    global _current
    pid = os.getpid()
    with _current_lock:
        # A forked child must not reuse the parent's pools; it builds its own.
        if _current is None or _current[0] != pid:
            from workers.app import app, settings

            _current = (pid, build_wiring(settings, app, middleware=[SoftTimeLimitAsRetry()]))
        return _current[1]


def close_current() -> None:
    """Close the wiring of this process, if it was built (worker process shutdown)."""
    global _current
    with _current_lock:
        built, _current = _current, None
    if built is not None and built[0] == os.getpid():
        try:
            built[1].close()
        except Exception:
            logger.exception("closing the worker's connections failed")


def build_runner(settings: WorkerSettings | None = None) -> AgentRunner:
    """Return an `AgentRunner` wired from the environment, for web apps and scripts.

    Its store, chat memory and conversation guard are the ones the workers use; its
    `start`, `submit_resume` and `cancel` save the turn and enqueue a `step_turn` message
    instead of running the turn in the calling thread. Agents come from
    `AGENT_RUNNER_AGENT_LOADER` when it is set; an `Agent` passed to `start` is registered
    in this runner's loader either way (the workers need it in theirs).

    Build it once at start-up and share it: every call opens its own database pool and
    Redis connections.

    Raises:
        SettingsError: An environment variable holds an unusable value.
    """
    settings = settings if settings is not None else WorkerSettings.from_env()
    from workers import app as app_module

    celery_app = app_module.app if settings == app_module.settings else app_module.create_app(settings)
    return build_wiring(settings, celery_app).runner
