"""Who is asking: the tenant behind a request's API key, and what that tenant may see.

With API keys configured, each tenant sees and changes only its own turns (turns carry
`AgentTurn.tenant_id`), and a conversation is named by its tenant and its id together (a
`ConversationKey`, built here from the request), so two tenants using the same
conversation id never share a conversation, its history or its inbox. Conversation ids are
stored and shown as the tenant named them. Without keys there is one tenant, `None`, that
sees everything.

A request made with a token (`workers.api.tokens`) also carries the token's end user, and
may be limited to one conversation: then every other conversation, and every turn outside
it, is answered like another tenant's.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_runner import AgentTurn, TurnNotFound
from agent_runner.limits import check_conversation_id
from agent_runner.persistence import ConversationKey
from workers.api.errors import ApiError


class ConversationNotFoundError(ApiError):
    """A conversation the request's token does not reach (404, like an unknown id)."""

    wire_type = "ConversationNotFound"

    def __init__(self, conversation_id: str) -> None:
        super().__init__(404, f"conversation {conversation_id!r} not found")


@dataclass(frozen=True)
class Tenant:
    """The tenant of a request (`id` None on a single-tenant server), and the token's user and conversation.

    Attributes:
        id: The tenant.
        user: The end user of the request's token (None for a request made with a key).
        conversation: The id of the one conversation of the tenant the token reaches (None: all of the tenant's).
    """

    id: str | None = None
    user: str | None = None
    conversation: str | None = None

    def conversation_key(self, conversation_id: str) -> ConversationKey:
        """This tenant's conversation `conversation_id`.

        Raises:
            InputLimitError: `conversation_id` breaks the id rules.
        """
        return ConversationKey(check_conversation_id(conversation_id), self.id)

    def owns(self, turn: AgentTurn, root: AgentTurn | None = None) -> bool:
        """Whether this tenant may see and change `turn`.

        Args:
            turn: The turn.
            root: The root turn of `turn` when it is a child turn: children belong to no
                conversation themselves, so a conversation-limited token reaches them
                through their root.
        """
        if self.id is not None and turn.tenant_id != self.id:
            return False
        if self.conversation is None:
            return True
        bound = root if root is not None and turn.conversation_id is None and root.id == turn.root_turn_id else turn
        return bound.conversation_id == self.conversation and bound.tenant_id == self.id

    def check(self, turn: AgentTurn, root: AgentTurn | None = None) -> AgentTurn:
        """Return `turn` if this tenant owns it (`root`: see `owns`).

        Raises:
            TurnNotFound: The turn belongs to another tenant, or lies outside the token's
                conversation (answered exactly like an unknown id).
        """
        if not self.owns(turn, root):
            raise TurnNotFound(turn.id)
        return turn

    def reaches(self, conversation_id: str) -> ConversationKey:
        """The conversation `conversation_id` of this tenant, which this request may read and change.

        Raises:
            InputLimitError: `conversation_id` breaks the id rules.
            ConversationNotFoundError: The request's token is limited to another conversation.
        """
        key = self.conversation_key(conversation_id)
        if self.conversation is not None and key.conversation_id != self.conversation:
            raise ConversationNotFoundError(conversation_id)
        return key
