"""Who is asking: the tenant behind a request's API key, and what that tenant may see.

With API keys configured, each tenant sees and changes only its own turns (turns carry
`AgentTurn.tenant_id`), and its conversations are stored under `"{tenant}/{id}"` so that
two tenants using the same conversation id never share a conversation, its history or
its inbox (`agent_runner.limits.scoped_conversation_id` builds these ids, and every path
that carries them accepts them). The prefix never leaves the server: every conversation id
shown is translated back. Without keys there is one tenant, `None`, that sees everything,
and conversation ids are stored as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_runner import AgentTurn, TurnNotFound
from agent_runner.limits import scoped_conversation_id, split_conversation_id


@dataclass(frozen=True)
class Tenant:
    """The tenant of a request (`id` None on a single-tenant server)."""

    id: str | None = None

    def stored_conversation(self, conversation_id: str) -> str:
        """The conversation id under which this tenant's conversation is stored.

        Raises:
            InputLimitError: `conversation_id` breaks the id rules.
        """
        return scoped_conversation_id(self.id, conversation_id)

    def shown_conversation(self, stored: str | None) -> str | None:
        """The conversation id this tenant knows for a stored one."""
        if stored is None or self.id is None:
            return stored
        owner, own = split_conversation_id(stored)
        return own if owner == self.id else stored

    def owns(self, turn: AgentTurn) -> bool:
        """Whether this tenant may see and change `turn`."""
        return self.id is None or turn.tenant_id == self.id

    def check(self, turn: AgentTurn) -> AgentTurn:
        """Return `turn` if this tenant owns it.

        Raises:
            TurnNotFound: The turn belongs to another tenant (answered exactly like an unknown id).
        """
        if not self.owns(turn):
            raise TurnNotFound(turn.id)
        return turn
