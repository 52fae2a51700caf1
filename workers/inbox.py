"""Starting turns from queued inbox messages, for every way of running turns.

A message waits in the `store.Inbox` while its conversation has an active turn. Once the
conversation is free, `start_next_message` claims the next message and starts its turn
(saved READY; whoever steps turns takes it from there). The Celery task `dispatch_inbox`,
the `InboxPump` of the embedded processes (the HTTP server, `agent-runner worker`) and
anything else that drains an inbox call it, so every path starts a message the same way
and at most once.

`enqueue_message` is the public way to queue a message for a conversation that may be
busy: the message waits its turn, and starts at once when the conversation is free.

`settle_stale_claims` repairs what a process that died between claiming a message and
marking it left behind; beat's inbox sweep and the inbox pump both call it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from agent_runner import (
    AgentConversationBusyException,
    AgentEvent,
    AgentRunner,
    AgentRunnerError,
    DefinitionError,
    TurnNotFound,
    UserMessage,
    VersionConflictError,
)
from agent_runner.errors import log_failure
from agent_runner.ids import new_id, queued_turn_id
from agent_runner.limits import check_reference, check_turn_input
from agent_runner.persistence import ConversationKey, chat_memory
from store import Inbox, InboxMessage
from workers.live import announce

logger = logging.getLogger("workers.inbox")

_TURNS_SEARCHED = 100
"""Most recent turns of a conversation searched for the one a message started."""


class InboxOutcome(StrEnum):
    """What one attempt to start the next inbox message of a conversation did."""

    STARTED = "started"
    ALREADY_STARTED = "already-started"
    EMPTY = "empty"
    BUSY = "busy"
    FAILED = "failed"
    NO_AGENT = "no-agent"
    REJECTED = "rejected"
    """The message's arguments did not fit the task (forged or corrupted); it was dropped."""


def enqueue_message(
    runner: AgentRunner,
    conversation_id: str,
    content: str,
    *,
    message_id: str | None = None,
    agent_id: str | None = None,
    tenant_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    inbox: Inbox | None = None,
) -> InboxMessage:
    """Queue a user message for a conversation; its turn starts once the conversation is free.

    The message joins the conversation's inbox (idempotent on `message_id`: queueing the
    same id again changes nothing), then the next message is asked for: with a runner
    from `workers.build_runner()` a `dispatch_inbox` message goes to the Celery workers;
    with any other runner the next message starts here if the conversation is free (the
    turn is saved READY for whoever steps turns). Either way a message queued behind a
    busy conversation starts when its active turn ends: the Celery workers, the HTTP
    server and `agent-runner worker` ask for the next message then; an embedded deployment
    of your own runs an `InboxPump` (or calls `start_next_message` when a conversation
    turn ends). A newly queued message's MESSAGE_QUEUED event goes where the runner's
    events go live (`workers.live.announce`), so the conversation's followers see it at once.

    Args:
        runner: The runner of the deployment.
        conversation_id: The conversation.
        content: The user's message.
        message_id: The client's id of the message, which makes a retried call harmless;
            it becomes the id of the turn's user message (default: a new id).
        agent_id: The agent that answers it (default: the deployment's inbox agent,
            `AGENT_RUNNER_INBOX_AGENT`, under Celery; required otherwise).
        tenant_id: The tenant of the turn started from it.
        metadata: JSON data kept with that turn.
        inbox: The inbox to use (default: one on the runner's SQL store).

    Returns:
        The stored message (PENDING, or already further along when it was queued before).

    Raises:
        InputLimitError: The content, an id or the metadata is over a limit of the runner's
            policy or breaks the id rules; nothing was queued.
        InvalidTextError: The content holds text no store can keep; nothing was queued.
        DefinitionError: No inbox was given and the runner's store is not a SQL store.
        StoreUnavailableError: The database could not be reached; nothing was queued.
    """
    # Checked now, as `runner.start` would: a message queued beyond a limit could never start.
    check_turn_input(runner.policy.limits, content, None, conversation_id, tenant_id, metadata)
    if message_id is not None:
        check_reference(message_id, "message_id", runner.policy.limits)
    if inbox is None:
        engine = getattr(runner.turn_store, "engine", None)
        if engine is None:
            raise DefinitionError("enqueue_message needs inbox=store.Inbox(url) when the runner's store is not SQL")
        inbox = Inbox(engine)
    message = inbox.enqueue(
        conversation_id,
        message_id or new_id(),
        content,
        agent_id=agent_id,
        tenant_id=tenant_id,
        metadata=metadata,
    )
    announce(runner, message.queued_event)
    send_inbox = getattr(runner.dispatcher, "send_inbox", None)
    if callable(send_inbox):
        send_inbox(message.conversation)
    else:
        start_next_message(runner, inbox, agent_id, message.conversation)
    return message


def start_next_message(
    runner: AgentRunner,
    inbox: Inbox,
    agent_id: str | None,
    conversation: ConversationKey,
    *,
    ask_again: Callable[[ConversationKey], object] | None = None,
) -> InboxOutcome:
    """Start a turn from the conversation's next PENDING inbox message, if the conversation is free.

    The turn takes the agent, tenant and metadata the message was queued with (`agent_id`
    answers messages queued without an agent), its user message takes the message's id,
    and its id is the one derived from the message (`InboxMessage.starts_as`), which the
    message's MESSAGE_QUEUED event named. A message never starts two turns: a second start
    of that id is refused by the store (a run that crashed between starting the turn and
    marking the message), and a turn started by an earlier version under a random id is
    found by the message id first.

    Args:
        runner: Starts the turn (its dispatcher, if any, hands it to the workers).
        inbox: The queue of the conversation.
        agent_id: The agent for messages queued without one; None when there is no default.
        conversation: The conversation to serve (its id and tenant).
        ask_again: Called with the conversation when the active turn may have ended while
            this call held the message, so that someone tries again (for example by sending
            a `dispatch_inbox` message); without it the next sweep does.

    Raises:
        StoreUnavailableError: The store could not be reached; the message stays queued.
    """
    if runner.turn_store.find_active_turn(conversation.conversation_id, conversation.tenant_id) is not None:
        return InboxOutcome.BUSY  # the turn's end asks again
    message = inbox.claim_next(conversation)
    if message is None:
        return InboxOutcome.EMPTY
    chosen = message.agent_id or agent_id
    if chosen is None:
        inbox.release_for_retry(message.message_id)
        logger.error(
            "inbox message %s of %s names no agent and AGENT_RUNNER_INBOX_AGENT is not set",
            message.message_id,
            conversation,
        )
        return InboxOutcome.NO_AGENT
    return _start_claimed(runner, inbox, chosen, message, ask_again)


def _start_claimed(
    runner: AgentRunner,
    inbox: Inbox,
    agent_id: str,
    message: InboxMessage,
    ask_again: Callable[[ConversationKey], object] | None,
) -> InboxOutcome:
    existing = turn_started_from(runner, message.conversation, message.message_id)
    if existing is not None:
        inbox.mark_completed(message.message_id, existing)
        return InboxOutcome.ALREADY_STARTED
    try:
        turn = runner.start(
            agent_id,
            UserMessage(id=message.message_id, content=message.content),
            conversation_id=message.conversation_id,
            tenant_id=message.tenant_id,
            metadata=message.metadata,
            turn_id=message.starts_as,
        )
    except VersionConflictError:
        inbox.mark_completed(message.message_id, message.starts_as)
        return InboxOutcome.ALREADY_STARTED
    except AgentConversationBusyException:
        inbox.release_for_retry(message.message_id)
        # The active turn may have ended while this message was claimed, and its end's
        # request for the next message then found the conversation claimed: ask again.
        if (
            ask_again is not None
            and runner.turn_store.find_active_turn(message.conversation_id, message.tenant_id) is None
        ):
            ask_again(message.conversation)
        return InboxOutcome.BUSY
    except AgentRunnerError as exc:
        if exc.retryable:
            inbox.release_for_retry(message.message_id)
            raise
        inbox.mark_failed(message.message_id, f"{type(exc).__name__}: {exc}")
        return InboxOutcome.FAILED
    except Exception as exc:
        logger.exception("starting a turn from inbox message %s failed", message.message_id)
        inbox.mark_failed(message.message_id, f"{type(exc).__name__}: {exc}")
        return InboxOutcome.FAILED
    inbox.mark_completed(message.message_id, turn.id)
    if inbox.coalesce:
        _coalesce(runner, inbox, message, turn.id)
    return InboxOutcome.STARTED


def _coalesce(runner: AgentRunner, inbox: Inbox, first: InboxMessage, turn_id: str) -> None:
    """Give the conversation's other waiting messages to the turn just started from `first`, in order.

    Each joins it as a steering message, read before its first model call (or handed on
    if it has ended); a message for another agent or tenant stops the run and waits for
    a turn of its own. A claimer that dies between the steer and the mark leaves a claim
    that `settle_stale_claims` puts back: the message may then also start a turn later.
    """
    while True:
        message = inbox.claim_next(first.conversation)
        if message is None:
            return
        if (message.agent_id, message.tenant_id) != (first.agent_id, first.tenant_id):
            inbox.release_for_retry(message.message_id)
            return
        try:
            taken = runner.steer(turn_id, message.content, message_id=message.message_id)
        except AgentRunnerError as exc:
            inbox.release_for_retry(message.message_id)
            log_failure(logger, exc, "could not add inbox message %s to turn %s", message.message_id, turn_id)
            return
        inbox.mark_completed(message.message_id, taken.id)


def settle_stale_claims(runner: AgentRunner, inbox: Inbox, claimed_before: datetime, limit: int = 100) -> int:
    """Finish or undo the inbox claims made before `claimed_before`; return how many were found.

    A claim this old means its claimer died between claiming the message and marking it:
    the message becomes COMPLETED if a turn was started from it, else PENDING again. A
    claimer that is only slow is not harmed: if its message goes back to PENDING, the next
    claim finds the turn it started (by the message id) and marks the message COMPLETED
    instead of starting a second turn. A claim that cannot be settled now (the store failed)
    is logged and left for the next sweep.

    Raises:
        StoreUnavailableError: The stale claims could not be listed.
    """
    stale = inbox.stale_claims(claimed_before, limit)
    for claim in stale:
        try:
            turn_id = turn_started_from(runner, claim.conversation, claim.message_id)
            if turn_id is not None:
                inbox.mark_completed(claim.message_id, turn_id)
            else:
                inbox.release_for_retry(claim.message_id)
        except AgentRunnerError as exc:
            logger.warning("could not settle inbox message %s: %s", claim.message_id, exc)
    return len(stale)


def turn_started_from(runner: AgentRunner, conversation: ConversationKey, message_id: str) -> str | None:
    """Return the id of the turn started from inbox message `message_id`, or None.

    The turn has the id derived from the message, so one read of it answers. A turn
    started by an earlier version has a random id: its first save projected its user
    message into ChatMemory, so one indexed read tells whether there is one, and only then
    are the conversation's turns searched for the first one that carries the message.
    """
    derived = queued_turn_id(conversation.conversation_id, message_id, conversation.tenant_id)
    try:
        runner.turn_store.get_ref(derived)
        return derived
    except TurnNotFound:
        pass
    provider = runner.chat_memory_provider
    if provider is None or chat_memory(provider, conversation).get(message_id) is None:
        return None
    turns = runner.turn_store.list_turns(
        conversation_id=conversation.conversation_id, tenant_id=conversation.tenant_id, limit=_TURNS_SEARCHED
    )
    turns = [t for t in turns if t.tenant_id == conversation.tenant_id]
    carrying = [t for t in turns if any(m.id == message_id for m in t.messages)]
    if not carrying:
        # Projected, so a turn was started from it, but it is beyond the search window.
        return turns[0].id if turns else None
    return min(carrying, key=lambda t: t.created_at).id


INBOX_SWEEP_INTERVAL_S = 2.0
"""How often an inbox pump looks for idle conversations with queued messages it was not told about."""

_STALE_INBOX_CLAIM = timedelta(seconds=60)


class InboxPump:
    """Starts queued inbox messages on a background thread of an embedded process.

    The HTTP server (embedded and `none` modes) and `agent-runner worker` run one, so any
    process that steps turns without Celery also starts the queued messages of the
    conversations it frees. It is told about conversations whose turn ended (`on_event`, a
    runner listener) and about messages queued while their conversation was free
    (`notify`); a sweep every `interval` seconds catches the rest (turns ended in other
    processes, a restart).

    Args:
        runner: Starts the turns.
        inbox: The queues.
        default_agent: Agent for messages queued without one (`AGENT_RUNNER_INBOX_AGENT`).
        interval: Seconds between sweeps.
    """

    def __init__(self, runner: AgentRunner, inbox: Inbox, default_agent: str | None, interval: float) -> None:
        self.runner = runner
        self.inbox = inbox
        self.default_agent = default_agent
        self.interval = interval
        self._pending: queue.SimpleQueue[ConversationKey | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def on_event(self, event: AgentEvent) -> None:
        """Runner listener: a conversation turn ended, so its next message may start."""
        if event.type.is_terminal and event.conversation_id is not None:
            self.notify(ConversationKey(event.conversation_id, event.tenant_id))

    def notify(self, conversation: ConversationKey) -> None:
        """Try to start the conversation's next message soon."""
        self._pending.put(conversation)

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
        except Exception as exc:
            log_failure(logger, exc, "the inbox pump failed; it tries again at the next sweep")

    def serve(self, conversation: ConversationKey) -> None:
        """Start the conversation's next message if it is free."""
        start_next_message(self.runner, self.inbox, self.default_agent, conversation, ask_again=self.notify)

    def sweep(self) -> None:
        """Settle claims of a process that died mid-start, then serve every idle conversation with a message."""
        settle_stale_claims(self.runner, self.inbox, self.runner.clock() - _STALE_INBOX_CLAIM)
        for conversation in self.inbox.conversations_ready():
            self.serve(conversation)
