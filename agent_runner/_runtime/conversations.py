"""The one-active-turn-per-conversation rule at creation time, with the optional fast guard."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from agent_runner.errors import AgentConversationBusyException, AgentRunnerError, VersionConflictError
from agent_runner.events import AgentEvent
from agent_runner.persistence import AgentTurnStore, ConversationGuard, ConversationKey
from agent_runner.snapshot import AgentTurn

logger = logging.getLogger("agent_runner")

Save = Callable[[AgentTurn, int, Sequence[AgentEvent]], AgentTurn]
"""A turn store's `save`, or a save that also projects the turn into ChatMemory."""


class ConversationGate:
    """Creates conversation turns so that at most one is active per conversation.

    The turn store is the truth (its unique index refuses a second active turn); the guard,
    when there is one (Redis), is a fast shared marker checked first and repaired from the
    store when it lost track. A guard that cannot be reached is skipped with a warning.
    """

    def __init__(self, turn_store: AgentTurnStore, guard: ConversationGuard | None) -> None:
        self.turn_store = turn_store
        self.guard = guard

    def create(self, turn: AgentTurn, events: Sequence[AgentEvent] = (), save: Save | None = None) -> AgentTurn:
        """Save a new turn (version -1) with the events its creation causes, by `save` (default: the store's).

        Raises:
            AgentConversationBusyException: The conversation already has an active turn.
            VersionConflictError: A turn with this id exists.
        """
        save = save if save is not None else self.turn_store.save
        conversation = None if turn.conversation_id is None else ConversationKey(turn.conversation_id, turn.tenant_id)
        guard = self.guard
        if conversation is None or guard is None:
            return save(turn, -1, events)
        self._claim(guard, conversation, turn.id)
        try:
            return save(turn, -1, events)
        except AgentConversationBusyException as busy:
            # The guard had lost track (for example Redis lost its data): repair it from the store.
            self._call(guard.replace, conversation, turn.id, busy.active_turn_id)
            raise
        except VersionConflictError:
            # A turn with this id is stored (a repeated start with a chosen id): a mark under
            # this id is that turn's, so it stays.
            raise
        except BaseException:
            self._call(guard.release, conversation, turn.id)
            raise

    def release(self, turn: AgentTurn) -> None:
        """Free the conversation of an ended turn in the guard."""
        if turn.conversation_id is not None and self.guard is not None:
            self._call(self.guard.release, ConversationKey(turn.conversation_id, turn.tenant_id), turn.id)

    def _claim(self, guard: ConversationGuard, conversation: ConversationKey, turn_id: str) -> None:
        holder = self._call(guard.claim, conversation, turn_id)
        if holder is None or holder == turn_id:
            return
        active = self.turn_store.find_active_turn(conversation.conversation_id, conversation.tenant_id)
        if active is not None:
            raise AgentConversationBusyException(conversation.conversation_id, active.id, active.status)
        # The holder ended (its release was lost): take the mark over; the store's unique
        # index still decides if two creators race here.
        self._call(guard.replace, conversation, holder, turn_id)

    @staticmethod
    def _call(method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except AgentRunnerError as exc:
            logger.warning("conversation guard unavailable, relying on the turn store: %s", exc)
            return None
