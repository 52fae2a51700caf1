"""Projection of saved turns into their conversation's ChatMemory."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from agent_runner._cas import AGAIN, retry_on_conflict
from agent_runner.errors import DefinitionError, VersionConflictError
from agent_runner.events import AgentEvent
from agent_runner.messages import SystemMessage
from agent_runner.persistence import (
    AgentTurnStore,
    ChatMemory,
    ChatMemoryProvider,
    ConversationKey,
    ProjectingTurnStore,
    chat_memory,
)
from agent_runner.snapshot import AgentTurn, PageAction
from agent_runner.store_rules import page_message, page_message_update

logger = logging.getLogger("agent_runner")


class Projection:
    """Copies new messages and page-action states of saved turns into ChatMemory.

    Args:
        provider: Maps a conversation id to its ChatMemory (None: conversations unsupported).
        on_error: Called with the turn and a description when projecting fails.
    """

    def __init__(self, provider: ChatMemoryProvider | None, on_error: Callable[[AgentTurn, str], None]) -> None:
        self.provider = provider
        self.on_error = on_error
        self._store_projects: tuple[AgentTurnStore, ProjectingTurnStore | None] | None = None

    def save(
        self, store: AgentTurnStore, turn: AgentTurn, expected_version: int, events: Sequence[AgentEvent]
    ) -> AgentTurn:
        """Save a turn; a conversation turn's messages go into ChatMemory in the same write when the store can.

        The store can when it is a `ProjectingTurnStore` that writes into this provider's
        ChatMemory; the returned snapshot's `projected_count` says how far it got, and
        `project` does the rest (page messages, or all of it with any other store).
        """
        projecting = self._projecting(store) if turn.conversation_id is not None else None
        if projecting is not None:
            return projecting.save_projected(turn, expected_version, events)
        return store.save(turn, expected_version, events)

    def _projecting(self, store: AgentTurnStore) -> ProjectingTurnStore | None:
        """The store, when it writes into this provider's ChatMemory in its saves; checked once per store."""
        known = self._store_projects
        if known is None or known[0] is not store:
            projecting = (
                store
                if self.provider is not None
                and isinstance(store, ProjectingTurnStore)
                and store.projects_into(self.provider)
                else None
            )
            known = self._store_projects = (store, projecting)
        return known[1]

    def memory(self, conversation: ConversationKey) -> ChatMemory:
        """The ChatMemory of a conversation.

        Raises:
            DefinitionError: The runner has no chat memory provider.
        """
        if self.provider is None:
            raise DefinitionError("conversation turns need AgentRunner(chat_memory_provider=...)")
        return chat_memory(self.provider, conversation)

    def project(self, turn: AgentTurn) -> AgentTurn:
        """Apply what ChatMemory does not show yet of a saved turn; return the turn with its marks moved on.

        Messages before `projected_count` and actions marked `synced` are known to be in
        ChatMemory; everything after is (re)applied. Idempotent (stable ids, compare-and-swap
        updates), so a retry after a crash never duplicates. A failure is reported through
        `on_error` and retried after the next save or on `restore`; it never fails the turn,
        whose store is the truth.
        """
        if turn.conversation_id is None or self.provider is None:
            return turn
        start = turn.projected_count
        new = [m for m in turn.messages[start:] if not isinstance(m, SystemMessage)]
        unsynced = [a for a in turn.page_actions if not a.synced]
        if not new and not unsynced and start == len(turn.messages):
            return turn
        try:
            memory = self.memory(ConversationKey(turn.conversation_id, turn.tenant_id))
            if new:
                memory.append(new)
            actions = list(turn.page_actions)
            for index, action in enumerate(actions):
                if action.synced:
                    continue
                _sync_page_action(memory, action)
                actions[index] = action.model_copy(update={"synced": True})
        except Exception as exc:
            logger.warning("projecting turn %s into ChatMemory failed: %s", turn.id, exc)
            self.on_error(turn, f"{type(exc).__name__}: {exc}")
            return turn
        return turn.model_copy(update={"projected_count": len(turn.messages), "page_actions": actions})


def _sync_page_action(memory: ChatMemory, action: PageAction) -> None:
    def attempt() -> object:
        stored = memory.get(action.message_id)
        if stored is None:
            memory.append([page_message(action.payload, action.status, action.decision)])
            stored = memory.get(action.message_id)
            if stored is None or getattr(stored, "status", None) == action.status:
                return None
        updated = page_message_update(stored, action)
        if updated is None:
            return None
        try:
            memory.update(updated, updated.version)  # the version read: every other field is as stored
        except VersionConflictError:
            return AGAIN
        return None

    retry_on_conflict(action.message_id, attempt)
