"""The HTTP API end to end against a real `agent-runner serve` process (embedded worker, SQLite)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.helpers.crash import CRASH_DIR_ENV
from tests.integration.api.api_agents import SECRET_TOKEN
from tests.integration.api.api_server import assert_error, blocked, ended, eventually, serve, status_is, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


def conversation() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def start(client: httpx.Client, text: str, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/turns", json={"agent_id": "desk", "input": text, **fields})
    assert response.status_code == 201, response.text
    view: dict[str, Any] = response.json()
    return view


def test_a_ticket_turn_goes_through_form_and_approval_to_its_answer(client: httpx.Client) -> None:
    chat = conversation()
    # Given a started turn: 201 with the turn view, READY for the worker
    created = start(client, "ticket please", conversation_id=chat, metadata={"user": "u-1"})
    assert created["status"] == "READY" and created["conversation_id"] == chat
    assert created["metadata"] == {"user": "u-1"} and created["agent_version"] == "2"
    # When the worker runs it, it waits for the form, whose frozen schema the view shows
    waiting = wait_for(client, created["id"], blocked)
    assert waiting["status"] == "WAITING_FOR_USER"
    suspension = waiting["suspension"]
    assert suspension["type"] == "USER_INPUT" and suspension["form"]["key"] == "ticket_details"
    assert suspension["form"]["schema"]["required"] == ["system", "scope"]
    assert suspension["tool_call"]["name"] == "request_user_input"
    call = suspension["correlation_id"]
    # Invalid data: 422 with one detail per field, and the turn is unchanged
    bad = client.post(
        f"/v1/turns/{created['id']}/resume", json={"action": "form", "tool_call_id": call, "data": {"system": "x"}}
    )
    error = assert_error(bad, 422, "InvalidResumeCommand")
    assert {d["path"] for d in error["details"]} == {"/system", "/scope"}
    assert client.get(f"/v1/turns/{created['id']}").json()["version"] == waiting["version"]
    # Valid data: 202, RUNNING for the worker, which then waits for the approval
    good = client.post(
        f"/v1/turns/{created['id']}/resume",
        json={"action": "form", "tool_call_id": call, "data": {"system": "login", "scope": "ALL_USERS"}},
    )
    assert good.status_code == 202 and good.json()["status"] == "RUNNING"
    approval = wait_for(client, created["id"], blocked)
    assert approval["status"] == "WAITING_FOR_APPROVAL"
    # The sensitive argument is masked everywhere the turn is shown
    tool_call = approval["suspension"]["tool_call"]
    assert tool_call["name"] == "open_ticket"
    assert tool_call["arguments"] == {"system": "login", "scope": "ALL_USERS", "api_token": "***"}
    assert approval["pending_tool_calls"][0]["arguments"]["api_token"] == "***"
    with_messages = client.get(f"/v1/turns/{created['id']}", params={"messages": "true"})
    assert SECRET_TOKEN not in with_messages.text and "***" in with_messages.text
    assert [m["role"] for m in with_messages.json()["messages"]][:2] == ["user", "assistant"]
    timeline = client.get(f"/v1/conversations/{chat}/messages")
    assert SECRET_TOKEN not in timeline.text
    # A stale decision (another call id) is a 409 and changes nothing
    stale = client.post(f"/v1/turns/{created['id']}/resume", json={"action": "approve", "tool_call_id": call})
    assert_error(stale, 409, "InvalidResumeCommand")
    # Approve: the saved call runs once and the model answers
    approved = client.post(
        f"/v1/turns/{created['id']}/resume",
        json={"action": "approve", "tool_call_id": tool_call["id"], "metadata": {"approver": "u-100"}},
    )
    assert approved.status_code == 202
    done = wait_for(client, created["id"], blocked)
    assert done["status"] == "COMPLETED" and done["final_output"] == "opened TICKET-login-ALL_USERS"
    assert done["suspension"] is None and done["pending_tool_calls"] == []
    # A duplicate approval of a finished turn is a 409
    again = client.post(
        f"/v1/turns/{created['id']}/resume", json={"action": "approve", "tool_call_id": tool_call["id"]}
    )
    assert_error(again, 409, "InvalidResumeCommand")


def test_the_page_timeline_shows_cards_in_their_current_status(client: httpx.Client) -> None:
    chat = conversation()
    turn = start(client, "ticket", conversation_id=chat)
    call = wait_for(client, turn["id"], blocked)["suspension"]["correlation_id"]
    form_items = client.get(f"/v1/conversations/{chat}/messages").json()["items"]
    form = next(item for item in form_items if item["role"] == "agent_form")
    assert form["status"] == "PENDING" and form["actions"] == ["SUBMIT"] and form["schema"]["type"] == "object"
    client.post(
        f"/v1/turns/{turn['id']}/resume",
        json={"action": "form", "tool_call_id": call, "data": {"system": "db", "scope": "ONE_USER"}},
    )
    waiting = wait_for(client, turn["id"], status_is("WAITING_FOR_APPROVAL"))
    # The timeline is written just after the save that changed the status: its card follows
    items = timeline_until(client, chat, lambda items: any(item["role"] == "agent_action" for item in items))
    roles = [item["role"] for item in items]
    assert roles[0] == "user" and roles.count("agent_form") == 1 and roles.count("agent_action") == 1
    form = next(item for item in items if item["role"] == "agent_form")
    card = next(item for item in items if item["role"] == "agent_action")
    assert form["status"] == "SUBMITTED" and form["actions"] == []
    assert card["status"] == "PENDING" and card["actions"] == ["APPROVE", "REJECT"]
    assert card["arguments"]["api_token"] == "***" and card["tool_name"] == "open_ticket"
    # Reject with a reason: the card updates in place and the model reads the reason
    rejected = client.post(
        f"/v1/turns/{turn['id']}/resume",
        json={"action": "reject", "tool_call_id": card["action_id"], "reason": "change freeze"},
    )
    assert rejected.status_code == 202
    done = wait_for(client, waiting["id"], blocked)
    assert done["status"] == "COMPLETED" and "change freeze" in done["final_output"]
    after = timeline_until(client, chat, lambda items: items[-1]["role"] == "assistant" and len(items) > len(roles))
    card = next(item for item in after if item["role"] == "agent_action")
    assert card["status"] == "REJECTED" and card["actions"] == []
    # Paging back: `before` gives the older messages, oldest first
    newest = client.get(f"/v1/conversations/{chat}/messages", params={"limit": 2}).json()["items"]
    older = client.get(f"/v1/conversations/{chat}/messages", params={"limit": 2, "before": newest[0]["id"]}).json()
    assert [m["id"] for m in older["items"]] == [m["id"] for m in after[-4:-2]]
    unknown = client.get(f"/v1/conversations/{chat}/messages", params={"before": "no-such-message"})
    assert_error(unknown, 422)
    assert client.get(f"/v1/conversations/{conversation()}/messages").json() == {"items": []}


def timeline_until(client: httpx.Client, chat: str, until: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Poll the conversation's timeline until `until(items)`; return the items."""
    deadline = time.monotonic() + timeout
    while True:
        items: list[dict[str, Any]] = client.get(f"/v1/conversations/{chat}/messages").json()["items"]
        if until(items):
            return items
        if time.monotonic() > deadline:
            pytest.fail(f"the timeline of {chat} never got there: {[item['role'] for item in items]}")
        time.sleep(0.05)


def page_message(client: httpx.Client, chat: str, role: str) -> dict[str, Any]:
    """The conversation's one page message of `role` (`agent_action` or `agent_form`)."""
    found = [item for item in client.get(f"/v1/conversations/{chat}/messages").json()["items"] if item["role"] == role]
    assert len(found) == 1, found
    message: dict[str, Any] = found[0]
    return message


def test_an_approval_records_who_approved_when_and_why(client: httpx.Client) -> None:
    chat = conversation()
    turn = start(client, "ticket", conversation_id=chat)
    call = wait_for(client, turn["id"], blocked)["suspension"]["correlation_id"]
    client.post(
        f"/v1/turns/{turn['id']}/resume",
        json={"action": "form", "tool_call_id": call, "data": {"system": "db", "scope": "ONE_USER"}},
    )
    waiting = wait_for(client, turn["id"], status_is("WAITING_FOR_APPROVAL"))
    assert waiting["suspension"]["kind"] == "approval"
    card = page_message(client, chat, "agent_action")
    assert card["kind"] == "approval" and card["decided_at"] is None and card["reason"] is None
    # Marking an ordinary approval done with a result is not one of its choices
    settle = {"action": "tool_result", "tool_call_id": card["action_id"], "content": "TICKET-made-up"}
    assert_error(client.post(f"/v1/turns/{turn['id']}/resume", json=settle), 409, "InvalidResumeCommand")

    before = datetime.now().astimezone()
    approved = client.post(
        f"/v1/turns/{turn['id']}/resume",
        json={
            "action": "approve",
            "tool_call_id": card["action_id"],
            "reason": "the db team expects it",
            "metadata": {"decided_by": "u-100"},
        },
    )
    assert approved.status_code == 202, approved.text

    done = wait_for(client, turn["id"], blocked)
    assert done["status"] == "COMPLETED" and done["final_output"] == "opened TICKET-db-ONE_USER"
    card = page_message(client, chat, "agent_action")
    assert (card["status"], card["decided_by"], card["reason"], card["actions"]) == (
        "APPROVED",
        "u-100",
        "the db team expects it",
        [],
    )
    assert datetime.fromisoformat(card["decided_at"]) >= before
    # The form was submitted with no one named: when, but not who or why
    form = page_message(client, chat, "agent_form")
    assert form["status"] == "SUBMITTED" and form["decided_at"] and form["decided_by"] is None
    assert form["reason"] is None


@pytest.fixture
def crashing_server(tmp_path: Path) -> Iterator[ApiServer]:
    """A server of its own whose `refund` tool kills it the first time it runs; leases expire after a second."""
    crashes = tmp_path / "crashes"
    crashes.mkdir()
    env = {"AGENT_RUNNER_LEASE_TTL_S": "1", CRASH_DIR_ENV: str(crashes)}
    yield from serve(tmp_path, database_url=None, args=None, **env)


def test_a_call_cut_off_by_a_crash_is_marked_done_by_a_person(crashing_server: ApiServer) -> None:
    chat = conversation()
    with crashing_server.client() as client:
        turn = start(client, "refund O-7", conversation_id=chat)
    # The refund's body killed the server after its start was saved; a new server takes over
    process = crashing_server.process
    assert process is not None
    eventually(lambda: process.poll() is not None, what="the server to die in the refund")
    crashing_server.restart()
    with crashing_server.client() as client:
        waiting = wait_for(client, turn["id"], blocked, what="the outcome-unknown question")
        assert waiting["status"] == "WAITING_FOR_APPROVAL"
        assert waiting["suspension"]["kind"] == "outcome_unknown"
        card = page_message(client, chat, "agent_action")
        assert (card["kind"], card["status"], card["actions"]) == (
            "outcome_unknown",
            "PENDING",
            ["RETRY", "MARK_DONE", "FAIL"],
        )
        assert_error(
            client.post(
                f"/v1/turns/{turn['id']}/resume", json={"action": "tool_result", "tool_call_id": card["action_id"]}
            ),
            422,
        )

        settled = client.post(
            f"/v1/turns/{turn['id']}/resume",
            json={
                "action": "tool_result",
                "tool_call_id": card["action_id"],
                "content": "the bank shows R-7 paid",
                "reason": "checked the bank statement",
                "metadata": {"approverId": "u-9"},
            },
        )
        assert settled.status_code == 202, settled.text

        done = wait_for(client, turn["id"], ended)
        assert done["status"] == "COMPLETED" and done["final_output"] == "refund: the bank shows R-7 paid"
        card = page_message(client, chat, "agent_action")
        assert (card["status"], card["decided_by"], card["reason"], card["actions"]) == (
            "SUBMITTED",
            "u-9",
            "checked the bank statement",
            [],
        )
        messages = client.get(f"/v1/turns/{turn['id']}", params={"messages": "true"}).json()["messages"]
        results = [m for m in messages if m["role"] == "tool"]
        # The refund was not run again: its one result is what the person gave
        assert [(m["tool_name"], m["content"], m["is_error"]) for m in results] == [
            ("refund", "the bank shows R-7 paid", False)
        ]


def test_plain_turns_input_answers_retry_and_delegation(client: httpx.Client) -> None:
    echo = start(client, "hello there")
    assert wait_for(client, echo["id"], blocked)["final_output"] == "echo: hello there"
    delegated = start(client, "delegate count the tickets")
    done = wait_for(client, delegated["id"], ended, what="the parent to end")
    assert done["status"] == "COMPLETED" and done["final_output"] == "helper said: echo: count the tickets"
    children = client.get("/v1/turns", params={"agent_id": "helper", "limit": 200}).json()["items"]
    child = next(c for c in children if c["parent_turn_id"] == delegated["id"])
    assert child["root_turn_id"] == delegated["id"] and child["status"] == "COMPLETED"
    # Actions that need fields refuse without them (422), and refuse fields they do not use
    assert_error(client.post(f"/v1/turns/{echo['id']}/resume", json={"action": "input"}), 422)
    assert_error(client.post(f"/v1/turns/{echo['id']}/resume", json={"action": "retry", "content": "x"}), 422)
    # A retry of a turn that does not wait for one is a 409
    assert_error(client.post(f"/v1/turns/{echo['id']}/resume", json={"action": "retry"}), 409)


def test_cancel_closes_out_a_waiting_turn_and_refuses_an_ended_one(client: httpx.Client) -> None:
    chat = conversation()
    turn = start(client, "ticket", conversation_id=chat)
    wait_for(client, turn["id"], blocked)
    cancelled = client.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "not needed"})
    assert cancelled.status_code == 202
    view = cancelled.json()
    assert view["status"] == "CANCELLED" and "not needed" in view["error"]
    # The form nobody filled in shows it was settled by the system, and why
    form = eventually(
        lambda: (f := page_message(client, chat, "agent_form"))["status"] == "CANCELLED" and f,
        what="the form card to be cancelled",
    )
    assert form["decided_by"] == "system" and "not needed" in form["reason"] and form["decided_at"]
    assert form["actions"] == []
    messages = client.get(f"/v1/turns/{turn['id']}", params={"messages": "true"}).json()["messages"]
    assert messages[-1]["role"] == "assistant" and messages[-2]["role"] == "tool"
    assert_error(client.post(f"/v1/turns/{turn['id']}/cancel"), 409, "TurnEndedError")
    # A body is optional
    other = start(client, "ticket", conversation_id=conversation())
    wait_for(client, other["id"], blocked)
    assert client.post(f"/v1/turns/{other['id']}/cancel").json()["status"] == "CANCELLED"


def test_listing_pages_newest_first_with_filters(client: httpx.Client) -> None:
    chat = conversation()
    ids = []
    for number in range(5):
        turn = start(client, f"number {number}", conversation_id=chat)
        wait_for(client, turn["id"], blocked)
        ids.append(turn["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"conversation_id": chat, "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/turns", params=params).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    completed = client.get("/v1/turns", params={"conversation_id": chat, "status": ["COMPLETED", "FAILED"]}).json()
    assert len(completed["items"]) == 5 and completed["next_cursor"] is None
    assert client.get("/v1/turns", params={"conversation_id": chat, "status": "READY"}).json()["items"] == []
    assert client.get("/v1/turns", params={"conversation_id": chat, "agent_id": "helper"}).json()["items"] == []
    assert_error(client.get("/v1/turns", params={"cursor": "bm90IGEgY3Vyc29y"}), 422)
    assert_error(client.get("/v1/turns", params={"status": "SLEEPING"}), 422)
    assert_error(client.get("/v1/turns", params={"limit": 0}), 422)


def test_unknown_turns_and_agents_are_404(client: httpx.Client) -> None:
    assert_error(client.get("/v1/turns/no-such-turn"), 404, "TurnNotFound")
    assert_error(client.post("/v1/turns/no-such-turn/resume", json={"action": "retry"}), 404, "TurnNotFound")
    assert_error(client.post("/v1/turns/no-such-turn/cancel"), 404, "TurnNotFound")
    assert_error(client.post("/v1/turns", json={"agent_id": "nobody", "input": "hi"}), 404, "AgentNotFound")
    assert_error(client.get("/v1/nothing-here"), 404)
    assert_error(client.delete("/v1/turns"), 405)


def test_agents_probes_docs_and_root(client: httpx.Client) -> None:
    agents = client.get("/v1/agents").json()["items"]
    desk = next(a for a in agents if a["id"] == "desk")
    assert desk["version"] == "2"
    tools = {t["name"]: t for t in desk["tools"]}
    assert tools["open_ticket"]["requires_approval"] is True and tools["pause"]["requires_approval"] is False
    assert "helper" in tools and tools["request_user_input"]["requires_approval"] is False
    assert desk["forms"] == [
        {"key": "ticket_details", "description": "What the ticket is about.", "schema": desk["forms"][0]["schema"]}
    ]
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok", "checks": {"database": "ok"}}
    assert client.get("/").status_code == 200
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for name in ("TurnView", "TurnList", "StartTurnRequest", "ResumeRequest", "ErrorResponse", "QueuedView"):
        assert name in schemas
    start_op = spec["paths"]["/v1/turns"]["post"]
    assert {"201", "202", "404", "409", "422"} <= set(start_op["responses"])
    assert "Idempotency-Key" in {p["name"] for p in start_op["parameters"]}
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample in `text` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_count_the_steps_and_ends_of_the_turns_the_server_ran(client: httpx.Client) -> None:
    before = client.get("/metrics")
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain")
    ended_before = _sample(before.text, "agent_runner_turns_ended_total", status="COMPLETED")
    steps_before = _sample(before.text, "agent_runner_steps_total", agent_id="desk")

    echo = start(client, "hello metrics")
    assert wait_for(client, echo["id"], ended)["status"] == "COMPLETED"

    def counted() -> str | None:
        # The end is counted from its event, during the last step; the step once it returned.
        text = client.get("/metrics").text
        ended_now = _sample(text, "agent_runner_turns_ended_total", status="COMPLETED") > ended_before
        stepped = _sample(text, "agent_runner_steps_total", agent_id="desk") > steps_before
        return text if ended_now and stepped else None

    after: str = eventually(counted, what="the ended turn and its steps to be counted")
    assert _sample(after, "agent_runner_turns_ended_total", status="COMPLETED") == ended_before + 1
