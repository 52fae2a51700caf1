"""A support-desk agent, end to end, on the embedded default (SQLite file, background worker threads).

Run it with `make demo` or `python -m workers.demo`. Nothing else needs to run: the
model is scripted, the store is a SQLite file under `.agent-runner/`, and an
`AgentWorker` advances the turns while this script plays the web app and the user.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from agent_runner import (
    Agent,
    AgentConversationBusyException,
    AgentEvent,
    AgentEventType,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentRunner,
    AgentToolContext,
    AgentTurn,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    ChatMemory,
    ChatRequest,
    InMemoryAgentTurnStore,
    InMemoryChatMemoryProvider,
    InvalidResumeCommand,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    TurnLease,
    tool,
)
from agent_runner.worker import AgentWorker

TICKET_FORM = AgentFormDefinition(
    key="support_ticket_details",
    description="Use when an incident ticket lacks the affected system or the impact scope.",
    schema={
        "type": "object",
        "properties": {
            "affected_system": {"type": "string", "minLength": 2, "title": "Affected system"},
            "impact_scope": {"type": "string", "enum": ["ONE_USER", "ALL_USERS"], "title": "Who is affected"},
        },
        "required": ["affected_system", "impact_scope"],
        "additionalProperties": False,
    },
)

CREATED_TICKETS: dict[str, str] = {}
"""Side-effect ledger of the demo: idempotency key -> ticket id."""


@tool(requires_approval=True)
def create_ticket(affected_system: str, impact_scope: Literal["ONE_USER", "ALL_USERS"]) -> str:
    """Open an incident ticket in the ticketing system."""
    key = AgentToolContext.current().get_idempotency_key()
    # A re-execution of the same call (after a crash) returns the ticket it already made.
    ticket = CREATED_TICKETS.setdefault(key, f"INC-{1000 + len(CREATED_TICKETS)}")
    return json.dumps({"ticket": ticket, "system": affected_system, "scope": impact_scope})


def _support_model() -> ScriptedChatModel:
    """The model's side of the conversation, decided from what it has seen so far."""

    def answer(request: ChatRequest) -> AiMessage:
        last = request.messages[-1]
        if isinstance(last, ToolMessage) and last.tool_name == "create_ticket":
            if last.is_error:
                return AiMessage(content="Understood, I did not open a ticket.")
            ticket = json.loads(last.content)["ticket"]
            return AiMessage(content=f"Done: incident {ticket} is open and the on-call team is paged.")
        if isinstance(last, ToolMessage) and last.tool_name == "request_user_input":
            details = json.loads(last.content)
            return AiMessage(tool_calls=[ToolCall(id="call-ticket", name="create_ticket", arguments=details)])
        return AiMessage(
            content="I need a few details first.",
            tool_calls=[ToolCall(id="call-form", name="request_user_input", arguments={"formKey": TICKET_FORM.key})],
        )

    return ScriptedChatModel(answer)


def build_agent() -> Agent:
    """The demo's support agent."""
    return Agent(
        id="support-agent",
        version="1",
        instructions="Open incident tickets. Call request_user_input when details are missing; never guess.",
        chat_model=_support_model(),
        tools=[AgentUserInputTool(forms=[TICKET_FORM]), create_ticket],
    )


def _say(text: str = "") -> None:
    print(text, flush=True)


def _print_event(event: AgentEvent) -> None:
    interesting = {
        AgentEventType.TURN_STARTED,
        AgentEventType.TURN_SUSPENDED,
        AgentEventType.TURN_RESUMED,
        AgentEventType.TOOL_STARTED,
        AgentEventType.TOOL_COMPLETED,
        *[t for t in AgentEventType if t.is_terminal],
    }
    if event.type in interesting:
        extra = {k: v for k, v in event.data.items() if k in ("tool_name", "suspension_type", "correlation_id")}
        _say(f"    [event] {event.type.value:<15} turn={event.turn_id[:8]} status={event.data['status']} {extra or ''}")


def _wait(runner: AgentRunner, turn_id: str, until: Callable[[AgentTurn], bool], timeout: float = 15.0) -> AgentTurn:
    deadline = time.monotonic() + timeout
    while True:
        turn = runner.turn_store.load(turn_id)
        if until(turn):
            return turn
        if time.monotonic() > deadline:
            raise TimeoutError(f"turn {turn_id} stayed {turn.status} for {timeout}s")
        time.sleep(0.02)


def _blocked(turn: AgentTurn) -> bool:
    return turn.is_terminal or turn.status.is_waiting


def _timeline(memory: ChatMemory) -> None:
    for message in memory.get_messages(50):
        match message.role:
            case "user":
                _say(f"    user      | {message.content}")
            case "assistant":
                calls = ", ".join(f"{c.name}({json.dumps(c.arguments)})" for c in message.tool_calls)
                _say(f"    assistant | {message.content or ''}{' -> ' + calls if calls else ''}")
            case "tool":
                _say(f"    tool      | {message.tool_name}: {message.content}")
            case "agent_action":
                actions = message.get_actions()
                _say(
                    f"    [card]    | approve {message.summary}? status={message.status.value} "
                    f"v{message.version} buttons={actions}"
                )
            case "agent_form":
                _say(
                    f"    [form]    | {message.form_key} status={message.status.value} "
                    f"v{message.version} buttons={message.get_actions()}"
                )


def _backends(memory_only: bool, folder: Path) -> tuple[Any, Any, TurnLease | None, str]:
    if memory_only:
        return InMemoryAgentTurnStore(), InMemoryChatMemoryProvider(), None, "in-memory"
    from store import SqlAgentTurnStore, SqlChatMemoryProvider, SqlTurnLease

    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'demo.db'}"
    return SqlAgentTurnStore(url), SqlChatMemoryProvider(url), SqlTurnLease(url), url


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memory", action="store_true", help="use in-memory backends instead of SQLite")
    parser.add_argument("--dir", type=Path, default=None, help="folder of the SQLite file (default: a new temp dir)")
    args = parser.parse_args(argv)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="agent-runner-demo-"))
    store, memories, lease, where = _backends(args.memory, folder)

    agent = build_agent()
    runner = AgentRunner(turn_store=store, chat_memory_provider=memories)
    runner.add_event_listener(_print_event)
    worker = AgentWorker(runner, lease=lease, concurrency=2, poll_interval=0.05)
    conversation = "demo-conversation"
    memory = memories(conversation)

    _say(f"== agent-runner demo: store {where}, an AgentWorker with 2 threads ==")
    with worker:
        _say("\n1. The web app enqueues the user's request (start saves READY; the worker runs it).")
        turn = runner.start(agent, "Users cannot log in, please open an incident.", conversation_id=conversation)
        turn = _wait(runner, turn.id, _blocked)
        assert turn.suspension is not None and turn.suspension.form is not None
        _say(f"   -> {turn.status}: the model asked for the form {turn.suspension.form.key!r}; frozen schema:")
        _say("      " + json.dumps(turn.suspension.form.schema, indent=2).replace("\n", "\n      "))

        _say("\n2. The user submits incomplete data: rejected against the frozen schema, turn unchanged.")
        call_id = turn.suspension.correlation_id or ""
        try:
            runner.submit_resume(turn.id, AgentResumeCommand.user_input(call_id, {"affected_system": "x"}))
        except InvalidResumeCommand as exc:
            for error in exc.errors:
                _say(f"   -> schema error: {error}")
        unchanged = runner.turn_store.load(turn.id)
        _say(f"   -> still {unchanged.status} at version {unchanged.version} (was {turn.version})")

        _say("\n3. The user submits valid data (submit_resume only saves; the worker continues).")
        data = {"affected_system": "login service", "impact_scope": "ALL_USERS"}
        runner.submit_resume(turn.id, AgentResumeCommand.user_input(call_id, data).with_metadata("submittedBy", "u-7"))
        turn = _wait(runner, turn.id, lambda t: t.status is AgentTurnStatus.WAITING_FOR_APPROVAL)
        _say(f"   -> {turn.status}: create_ticket needs approval. The page shows:")
        _timeline(memory)

        _say("\n4. The user types again while the turn waits: the conversation is busy.")
        try:
            runner.start(agent, "hello? anyone?", conversation_id=conversation)
        except AgentConversationBusyException as busy:
            _say(f"   -> busy: active turn {busy.active_turn_id[:8]} is {busy.status} (answer 409 or queue it)")

        _say("\n5. A supervisor approves; the saved call runs once and the model answers.")
        approval = AgentResumeCommand.approve_tool("call-ticket").with_metadata("approverId", "u-100")
        runner.submit_resume(turn.id, approval)
        turn = _wait(runner, turn.id, _blocked)
        _say(f"   -> {turn.status}: {turn.final_output}  (tickets created: {len(CREATED_TICKETS)})")
        _say("   The page after the decision (the card was updated in place, nothing appended):")
        _timeline(memory)

        _say("\n6. A second turn is cancelled while it waits for approval: its history is closed out.")
        second = runner.start(agent, "Open another incident for the VPN.", conversation_id=conversation)
        second = _wait(runner, second.id, _blocked)
        form_call = second.suspension.correlation_id if second.suspension else None
        runner.submit_resume(second.id, AgentResumeCommand.user_input(form_call or "", data))
        second = _wait(runner, second.id, lambda t: t.status is AgentTurnStatus.WAITING_FOR_APPROVAL)
        second = runner.cancel(second.id)
        _say(f"   -> {second.status}: {second.error}")
        for message in second.messages[-2:]:
            _say(f"      {message.role}: {getattr(message, 'content', '')}")

    ok = turn.status is AgentTurnStatus.COMPLETED and second.status is AgentTurnStatus.CANCELLED
    _say(f"\n== demo {'finished' if ok else 'FAILED'}; store: {where} ==")
    return 0 if ok and len(CREATED_TICKETS) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
