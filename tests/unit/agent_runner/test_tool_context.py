"""What a tool learns about whom it acts for: metadata, conversation, tenant and its approval."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agent_runner import (
    Agent,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurnStatus,
    AiMessage,
    DefinitionError,
    InMemoryChatMemory,
    InMemoryChatMemoryProvider,
    ScriptedChatModel,
    ToolApproval,
    ToolCall,
    tool,
)


def _runner() -> AgentRunner:
    return AgentRunner(chat_memory_provider=InMemoryChatMemoryProvider())


class Seen:
    """What the tools of one test saw in their context."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []

    def record(self) -> str:
        ctx = AgentToolContext.current()
        self.contexts.append(
            {
                "metadata": ctx.metadata,
                "conversation_id": ctx.conversation_id,
                "tenant_id": ctx.tenant_id,
                "approval": ctx.approval,
            }
        )
        return "done"


def _agent(seen: Seen, *, requires_approval: bool = False) -> Agent:
    @tool(requires_approval=requires_approval)
    def act() -> str:
        """Act for the caller."""
        return seen.record()

    model = ScriptedChatModel([AiMessage(tool_calls=[ToolCall(id="c1", name="act", arguments={})]), AiMessage("ok")])
    return Agent(id="acting", chat_model=model, tools=[act])


def test_a_tool_sees_the_turn_metadata_conversation_and_tenant() -> None:
    # Given: a tenant's turn in a conversation of that tenant
    seen = Seen()
    runner = _runner()
    queued = runner.start(_agent(seen), "go", conversation_id="c-7", tenant_id="acme", metadata={"user_id": "u-42"})
    # When: the turn runs its tool
    turn = runner.run_until_blocked(queued)
    # Then: the tool sees the caller's own conversation id, the tenant apart, and the metadata
    assert turn.status is AgentTurnStatus.COMPLETED
    [context] = seen.contexts
    assert context == {
        "metadata": {"user_id": "u-42"},
        "conversation_id": "c-7",
        "tenant_id": "acme",
        "approval": None,
    }


def test_without_a_tenant_the_conversation_id_is_shown_as_stored_and_metadata_is_empty() -> None:
    seen = Seen()
    _runner().run(_agent(seen), "go", conversation_id="c-1")
    [context] = seen.contexts
    assert (context["conversation_id"], context["tenant_id"], dict(context["metadata"])) == ("c-1", None, {})


def test_a_turn_outside_a_conversation_has_no_conversation_id() -> None:
    seen = Seen()
    AgentRunner().run(_agent(seen), "go")
    [context] = seen.contexts
    assert (context["conversation_id"], context["tenant_id"]) == (None, None)


def test_the_metadata_a_tool_sees_cannot_change_the_turn() -> None:
    # Given: a tool that tries to change the metadata it sees, nested values included
    attempts: list[str] = []

    @tool
    def meddle() -> str:
        """Meddle."""
        metadata = AgentToolContext.current().metadata
        with pytest.raises(TypeError):
            metadata["user_id"] = "someone-else"  # type: ignore[index]
        metadata["roles"].append("admin")
        attempts.append(str(AgentToolContext.current().metadata["roles"]))
        return "ok"

    model = ScriptedChatModel([AiMessage(tool_calls=[ToolCall(id="c1", name="meddle", arguments={})]), AiMessage("ok")])
    turn = AgentRunner().run(Agent(id="m", chat_model=model, tools=[meddle]), "go", metadata={"roles": ["reader"]})
    # Then: neither the next look nor the saved turn shows the change
    assert attempts == ["['reader']"]
    assert turn.metadata == {"roles": ["reader"]}


def test_an_approved_call_sees_who_approved_it_when_and_why() -> None:
    # Given: a call waiting for approval
    seen = Seen()
    runner = _runner()
    waiting = runner.run(_agent(seen, requires_approval=True), "go", metadata={"user_id": "u-1"})
    assert waiting.status is AgentTurnStatus.WAITING_FOR_APPROVAL and seen.contexts == []
    before = datetime.now(UTC)
    # When: a person approves it with a reason
    command = AgentResumeCommand.approve_tool("c1").with_metadata("approverId", "ops-9").with_metadata("reason", "ok")
    turn = runner.resume(waiting.id, command)
    # Then: the tool sees the decision
    assert turn.status is AgentTurnStatus.COMPLETED
    approval = seen.contexts[0]["approval"]
    assert isinstance(approval, ToolApproval)
    assert (approval.decided_by, approval.reason) == ("ops-9", "ok")
    assert before <= approval.decided_at <= datetime.now(UTC)


def test_a_sub_agent_tool_acts_for_the_parent_turn_caller() -> None:
    # Given: a lead agent that delegates to a sub-agent whose tool reads its context
    seen = Seen()
    helper = _agent(seen)
    lead_model = ScriptedChatModel(
        [AiMessage(tool_calls=[ToolCall(id="d1", name="acting", arguments={"task": "do it"})]), AiMessage("done")]
    )
    lead = Agent(id="lead", chat_model=lead_model, sub_agents=[helper])
    # When: the lead runs for a tenant's user
    turn = _runner().run(lead, "go", conversation_id="c-2", tenant_id="acme", metadata={"user_id": "u-5"})
    # Then: the sub-agent's tool sees the same caller and conversation
    assert turn.status is AgentTurnStatus.COMPLETED
    [context] = seen.contexts
    assert (dict(context["metadata"]), context["conversation_id"], context["tenant_id"]) == (
        {"user_id": "u-5"},
        "c-2",
        "acme",
    )


def test_a_tenants_turn_needs_a_chat_memory_provider_that_keeps_tenants_apart() -> None:
    # Given a provider of one memory per conversation id, whatever the tenant
    runner = AgentRunner(chat_memory_provider=InMemoryChatMemory)
    # When a tenant's turn starts in a conversation, then it is refused before anything is saved
    with pytest.raises(DefinitionError, match="takes no tenant_id"):
        runner.start(_agent(Seen()), "go", conversation_id="c-1", tenant_id="acme")
    assert runner.turn_store.find_active_turn("c-1", "acme") is None
    # And a turn without a tenant still uses it
    assert runner.run(_agent(Seen()), "go", conversation_id="c-1").status is AgentTurnStatus.COMPLETED
