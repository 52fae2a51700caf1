"""The console against a real `agent-runner serve` (embedded mode: SQLite and worker threads) in headless Chromium.

The `support-desk` agent of `console_agents.py` asks for a form, waits for an approval of
`create_ticket` (whose access token is sensitive), then streams its answer; `refunds`
pays a refund with a tool whose first run kills the server, so that a person settles it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from agent_runner import AgentSuspension, AgentTurn, AgentTurnStatus, SystemMessage, ToolMessage, UserMessage
from store import SqlAgentTurnStore
from tests.browser.browser_kit import (
    chromium,
    console_errors,
    control,
    describedby,
    group,
    retype,
    screenshot,
    wait_for,
)
from tests.browser.console_agents import answer_for
from tests.browser.console_server import ConsoleServer, serve
from tests.helpers.crash import CRASH_DIR_ENV

SECRET = "tok-SECRET-4242"
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    with serve(tmp_path_factory.mktemp("console-server")) as running:
        yield running


@pytest.fixture
def page(browser: WebDriver, server: ConsoleServer) -> Iterator[WebDriver]:
    """The console with a clean tab state; fails on any script error in the page."""
    browser.set_window_size(1280, 900)
    browser.get(server.url + "/")
    browser.execute_script("sessionStorage.clear(); localStorage.clear()")
    yield browser
    assert console_errors(browser) == []


def open_console(driver: WebDriver, server: ConsoleServer, route: str) -> None:
    driver.get(f"{server.url}/#{route}")
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "main h1"), message="the page heading")


def start_turn(server: ConsoleServer, conversation_id: str | None, text: str = "VPN is down") -> dict[str, Any]:
    body: dict[str, Any] = {"agent_id": "support-desk", "input": text}
    if conversation_id:
        body["conversation_id"] = conversation_id
    answer: dict[str, Any] = server.ok("POST", "/v1/turns", body)
    return answer


def wait_status(server: ConsoleServer, turn_id: str, status: str, *, key: str | None = None) -> dict[str, Any]:
    return wait_for(
        lambda: (t := server.turn(turn_id, key=key))["status"] == status and t,
        timeout=TIMEOUT,
        message=f"turn {turn_id} to be {status}",
    )


def submit_ticket_form(server: ConsoleServer, turn: dict[str, Any], users: int = 40) -> dict[str, Any]:
    call_id = turn["suspension"]["correlation_id"]
    data = {"affected_system": "vpn", "impact_scope": "ALL_USERS", "users": users}
    server.ok("POST", f"/v1/turns/{turn['id']}/resume", {"action": "form", "tool_call_id": call_id, "data": data})
    return wait_status(server, turn["id"], "WAITING_FOR_APPROVAL")


def card(driver: WebDriver, role: str, status: str | None = None) -> WebElement:
    selector = f"li[data-role='{role}']" + (f"[data-status='{status}']" if status else "")
    return wait_for(
        lambda: driver.find_element(By.CSS_SELECTOR, selector), timeout=TIMEOUT, message=f"a {role} card {status or ''}"
    )


def expected_answer(server: ConsoleServer, turn_id: str) -> str:
    """What the scripted model streams after the decision, from the tool result the server stored."""
    turn = server.turn(turn_id)
    result = [m for m in turn["messages"] if m["role"] == "tool" and m["tool_name"] == "create_ticket"][-1]
    return answer_for(
        ToolMessage(
            tool_call_id=result["tool_call_id"],
            tool_name=result["tool_name"],
            content=result["content"],
            is_error=result["is_error"],
        )
    )


def watch_stream(driver: WebDriver, expected: str, *, until: float) -> list[str]:
    """Texts of the streaming bubble seen until it is gone or `until`; each must be a prefix of `expected`."""
    seen: list[str] = []
    while time.monotonic() < until:
        texts = driver.execute_script(
            "return [...document.querySelectorAll('li.msg-streaming .bubble')].map((e) => e.textContent)"
        )
        for text in texts:
            if text and (not seen or seen[-1] != text):
                seen.append(text)
                assert expected.startswith(text), f"streamed text is not a prefix of the answer: {text!r}"
        if seen and not texts:
            break
        time.sleep(0.03)
    return seen


def final_answers(driver: WebDriver) -> list[str]:
    texts: list[str] = driver.execute_script(
        "return [...document.querySelectorAll('li.msg-assistant:not(.msg-streaming) .bubble')].map((e) => e.textContent)"
    )
    return texts


def stored_card(server: ConsoleServer, conversation_id: str, role: str) -> dict[str, Any]:
    """The newest page message of `role` the server holds for the conversation."""
    items = server.ok("GET", f"/v1/conversations/{conversation_id}/messages")["items"]
    found: dict[str, Any] = [m for m in items if m["role"] == role][-1]
    return found


def assert_shows_decision(element: WebElement, stored: dict[str, Any], verb: str) -> None:
    """The card says what was decided, by whom, when (the stored instant) and why, as the server recorded it."""
    decision = element.find_element(By.CSS_SELECTOR, ".decision")
    line = decision.find_element(By.CSS_SELECTOR, ".decision-line").text
    assert line.startswith(f"{verb} by {stored['decided_by']} on "), line
    assert decision.find_element(By.TAG_NAME, "time").get_attribute("datetime") == stored["decided_at"]
    assert decision.find_element(By.CSS_SELECTOR, ".decision-reason").text == f"Reason: {stored['reason']}"


def field_error(driver: WebDriver, element: WebElement) -> str:
    return " | ".join(e.text for e in describedby(driver, element) if "field-error" in (e.get_attribute("class") or ""))


def test_form_errors_fix_approve_with_reason_and_streamed_answer(page: WebDriver, server: ConsoleServer) -> None:
    open_console(page, server, "/start")
    wait_for(
        lambda: (
            "support-desk"
            in [o.get_attribute("value") for o in Select(page.find_element(By.ID, "start-agent")).options]
        )
    )
    Select(page.find_element(By.ID, "start-agent")).select_by_value("support-desk")
    page.find_element(By.ID, "start-conversation").send_keys("c-flow")
    page.find_element(By.ID, "start-input").send_keys("The VPN is down for everyone")
    screenshot(page, "console-start")
    page.find_element(By.XPATH, "//button[normalize-space()='Start turn']").click()
    wait_for(lambda: page.current_url.endswith("#/conversations/c-flow"), message="the conversation page")

    form_card = card(page, "agent_form", "PENDING")
    screenshot(page, "console-form")
    # Invalid values: each comes back from the server next to its field.
    control(form_card, "Affected system").send_keys("x")
    Select(control(form_card, "Impact scope")).select_by_visible_text("ALL_USERS")
    control(form_card, "Users affected").send_keys("0")
    tags = group(form_card, "Tags")
    tags.find_element(By.XPATH, ".//button[normalize-space()='Add tag']").click()
    control(tags, "Tag 1").send_keys("a")
    control(group(form_card, "Contact"), "Email").send_keys("not-an-email")
    form_card.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    system = control(form_card, "Affected system")
    users = control(form_card, "Users affected")
    tag = control(tags, "Tag 1")
    email = control(group(form_card, "Contact"), "Email")
    wait_for(lambda: field_error(page, users), timeout=TIMEOUT, message="the server's field errors")
    for element in (system, users, tag, email):
        assert field_error(page, element), element.get_attribute("id")
        assert element.get_attribute("aria-invalid") == "true"
    assert "1" in field_error(page, users)
    assert [
        system.get_attribute("value"),
        users.get_attribute("value"),
        tag.get_attribute("value"),
        email.get_attribute("value"),
    ] == [
        "x",
        "0",
        "a",
        "not-an-email",
    ]
    assert form_card.get_attribute("data-status") == "PENDING"
    screenshot(page, "console-form-errors")

    retype(system, "vpn")
    retype(users, "40")
    retype(tag, "eu-west")
    retype(email, "ops@example.com")
    form_card.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    # The same card turns SUBMITTED in place; then the approval card arrives.
    card(page, "agent_form", "SUBMITTED")
    approval = card(page, "agent_action", "PENDING")
    assert approval.find_elements(By.CSS_SELECTOR, ".masked"), "the access token is shown masked"
    assert SECRET not in page.find_element(By.TAG_NAME, "body").text
    assert "vpn" in approval.text and "ALL_USERS" in approval.text

    assert [b.text for b in approval.find_elements(By.CSS_SELECTOR, ".decision-buttons button")] == [
        "Approve",
        "Reject",
    ]
    control(approval, "Reason").send_keys("Checked with the network team")
    control(approval, "Your name").send_keys("Dana from IT")
    screenshot(page, "console-approval")
    approval.find_element(By.XPATH, ".//button[normalize-space()='Approve']").click()

    turn_id = server.ok("GET", "/v1/turns?conversation_id=c-flow")["items"][0]["id"]
    expected = wait_for(lambda: _expected_when_decided(server, turn_id), timeout=TIMEOUT, message="the tool result")
    seen = watch_stream(page, expected, until=time.monotonic() + TIMEOUT)
    assert len(seen) >= 2, f"the answer did not stream in pieces: {seen}"
    wait_for(lambda: expected in final_answers(page), timeout=TIMEOUT, message="the final answer")
    assert final_answers(page).count(expected) == 1
    wait_status(server, turn_id, "COMPLETED")

    # Who approved, when and why: recorded by the server and shown on the card.
    stored = stored_card(server, "c-flow", "agent_action")
    assert (stored["status"], stored["decided_by"], stored["reason"]) == (
        "APPROVED",
        "Dana from IT",
        "Checked with the network team",
    )
    approved = card(page, "agent_action", "APPROVED")
    assert_shows_decision(approved, stored, "Approved")
    assert not approved.find_elements(By.TAG_NAME, "button")
    # This browser remembers the name for the next decision.
    assert page.execute_script("return localStorage.getItem('agent-runner.decided-by')") == "Dana from IT"
    submitted = card(page, "agent_form", "SUBMITTED")
    assert (
        submitted.find_element(By.TAG_NAME, "time").get_attribute("datetime")
        == (stored_card(server, "c-flow", "agent_form")["decided_at"])
    )
    screenshot(page, "console-conversation-done")


def _expected_when_decided(server: ConsoleServer, turn_id: str) -> str | None:
    turn = server.turn(turn_id)
    if not any(m["role"] == "tool" and m["tool_name"] == "create_ticket" for m in turn["messages"]):
        return None
    return expected_answer(server, turn_id)


def test_reload_mid_stream_continues_with_no_gap_or_repeat(page: WebDriver, server: ConsoleServer) -> None:
    turn = submit_ticket_form(
        server, wait_status(server, start_turn(server, "c-reload")["id"], "WAITING_FOR_USER"), users=7
    )
    open_console(page, server, "/conversations/c-reload")
    approval = card(page, "agent_action", "PENDING")
    approval.find_element(By.XPATH, ".//button[normalize-space()='Approve']").click()

    expected = wait_for(lambda: _expected_when_decided(server, turn["id"]), timeout=TIMEOUT, message="the tool result")
    before = wait_for(
        lambda: (
            (t := page.execute_script("return document.querySelector('li.msg-streaming .bubble')?.textContent || ''"))
            and len(t) >= 24
            and t
        ),
        timeout=TIMEOUT,
        message="part of the answer",
    )
    assert expected.startswith(before) and before != expected
    screenshot(page, "console-streaming")

    page.refresh()
    # The partial text is back at once (from this tab's storage) and the stream goes on after the cursor.
    restored = wait_for(
        lambda: page.execute_script("return document.querySelector('li.msg-streaming .bubble')?.textContent || ''"),
        timeout=TIMEOUT,
        message="the restored partial answer",
    )
    assert restored.startswith(before) and expected.startswith(restored)
    seen = watch_stream(page, expected, until=time.monotonic() + TIMEOUT)
    assert any(len(text) > len(restored) for text in seen), f"the stream did not continue after the reload: {seen}"
    wait_for(lambda: expected in final_answers(page), timeout=TIMEOUT, message="the final answer")
    assert final_answers(page).count(expected) == 1

    def saved() -> Any:
        return json.loads(
            page.execute_script("return sessionStorage.getItem('agent-runner.stream.conversation.c-reload')")
        )

    wait_for(
        lambda: saved()["cursor"] and saved()["partials"] == {},
        timeout=TIMEOUT,
        message="the saved stream position with no partial answer left",
    )

    # A second reload after the end shows the answer once, from the timeline.
    page.refresh()
    wait_for(
        lambda: final_answers(page) == [expected] or final_answers(page).count(expected) == 1,
        timeout=TIMEOUT,
        message="the answer after reload",
    )
    time.sleep(1.0)
    assert final_answers(page).count(expected) == 1


def test_reject_with_reason(page: WebDriver, server: ConsoleServer) -> None:
    turn = submit_ticket_form(server, wait_status(server, start_turn(server, "c-reject")["id"], "WAITING_FOR_USER"))
    # The name given with an earlier decision in this browser is offered again.
    page.execute_script("localStorage.setItem('agent-runner.decided-by', 'Sam')")
    open_console(page, server, "/conversations/c-reject")
    approval = card(page, "agent_action", "PENDING")
    assert control(approval, "Your name").get_attribute("value") == "Sam"
    control(approval, "Reason").send_keys("Wrong system, this is the Wi-Fi")
    approval.find_element(By.XPATH, ".//button[normalize-space()='Reject']").click()

    rejected = card(page, "agent_action", "REJECTED")
    assert not rejected.find_elements(By.TAG_NAME, "button")
    stored = stored_card(server, "c-reject", "agent_action")
    assert (stored["status"], stored["decided_by"], stored["reason"]) == (
        "REJECTED",
        "Sam",
        "Wrong system, this is the Wi-Fi",
    )
    assert_shows_decision(rejected, stored, "Rejected")
    done = wait_status(server, turn["id"], "COMPLETED")
    tool_result = [m for m in done["messages"] if m["role"] == "tool" and m["tool_name"] == "create_ticket"][-1]
    assert "Wrong system, this is the Wi-Fi" in tool_result["content"]
    expected = expected_answer(server, turn["id"])
    wait_for(lambda: expected in final_answers(page), timeout=TIMEOUT, message="the answer after the rejection")
    screenshot(page, "console-rejected")


def test_cancel_a_waiting_turn(page: WebDriver, server: ConsoleServer) -> None:
    turn = wait_status(server, start_turn(server, "c-cancel")["id"], "WAITING_FOR_USER")
    open_console(page, server, "/conversations/c-cancel")
    card(page, "agent_form", "PENDING")
    page.find_element(By.XPATH, "//button[normalize-space()='Cancel turn']").click()
    reason = page.switch_to.active_element
    assert (
        page.find_element(By.CSS_SELECTOR, f"label[for='{reason.get_attribute('id')}']").text == "Reason for cancelling"
    )
    reason.send_keys("Duplicate of an open ticket")
    page.find_element(By.XPATH, "//button[normalize-space()='Confirm cancel']").click()

    wait_for(
        lambda: page.find_element(By.CSS_SELECTOR, ".active-turn .badge").get_attribute("data-status") == "CANCELLED",
        timeout=TIMEOUT,
        message="the cancelled badge",
    )
    assert server.turn(turn["id"])["status"] == "CANCELLED"
    assert not page.find_elements(By.XPATH, "//button[normalize-space()='Cancel turn']")
    # The form nobody filled in is closed by the system, with the reason given for cancelling.
    cancelled = card(page, "agent_form", "CANCELLED")
    stored = stored_card(server, "c-cancel", "agent_form")
    assert (stored["status"], stored["decided_by"]) == ("CANCELLED", "system")
    assert "Duplicate of an open ticket" in stored["reason"]
    assert_shows_decision(cancelled, stored, "Cancelled")
    assert cancelled.find_element(By.CSS_SELECTOR, ".badge").text == "Cancelled"
    assert not cancelled.find_elements(By.CSS_SELECTOR, "form, button")
    screenshot(page, "console-cancelled")


def test_waiting_list_is_live_newest_first(page: WebDriver, server: ConsoleServer) -> None:
    open_console(page, server, "/")
    first = wait_status(server, start_turn(server, "c-wait-1")["id"], "WAITING_FOR_USER")
    second = submit_ticket_form(server, wait_status(server, start_turn(server, "c-wait-2")["id"], "WAITING_FOR_USER"))

    def order() -> list[str]:
        # One read in the page: the list redraws an item whenever its turn changes.
        ids: list[str] = page.execute_script(
            "return [...document.querySelectorAll('.turn-list > li')].map((e) => e.dataset.turnId)"
        )
        return ids

    def item_text(turn_id: str) -> str:
        text: str = page.execute_script(
            "const e = document.querySelector(`.turn-list > li[data-turn-id='${arguments[0]}']`);"
            "return e ? `${e.dataset.status}: ${e.textContent}` : ''",
            turn_id,
        )
        return text

    wait_for(lambda: first["id"] in order() and second["id"] in order(), timeout=TIMEOUT, message="both waiting turns")
    listed = order()
    assert listed.index(second["id"]) < listed.index(first["id"]), "newest first"
    assert item_text(second["id"]).startswith("WAITING_FOR_APPROVAL: Approve create_ticket")
    assert item_text(first["id"]).startswith("WAITING_FOR_USER: Fill in: Ticket details")
    screenshot(page, "console-waiting")

    server.ok("POST", f"/v1/turns/{first['id']}/cancel", {"reason": "test"})
    wait_for(lambda: first["id"] not in order(), timeout=TIMEOUT, message="the cancelled turn to leave the list")
    page.find_element(By.CSS_SELECTOR, f"li[data-turn-id='{second['id']}']").find_element(
        By.LINK_TEXT, "Turn details"
    ).click()
    wait_for(lambda: page.current_url.endswith(f"#/turns/{second['id']}"), message="the turn page")
    approval = card(page, "agent_action", "PENDING")
    assert approval.find_elements(By.CSS_SELECTOR, ".masked")

    # The turn page draws its facts, badge and calls again on every refresh: read them in one go each.
    def calls_shown() -> bool:
        calls = page.find_element(By.CSS_SELECTOR, "table.calls")
        return "create_ticket" in calls.text and bool(calls.find_elements(By.CSS_SELECTOR, ".masked"))

    wait_for(calls_shown, message="the pending call with its token masked")
    wait_for(
        lambda: (
            page.find_element(By.CSS_SELECTOR, ".turn-badge .badge").get_attribute("data-status")
            == "WAITING_FOR_APPROVAL"
        ),
        message="the turn's badge",
    )
    assert SECRET not in page.find_element(By.TAG_NAME, "body").text
    screenshot(page, "console-turn")


def test_phone_width(page: WebDriver, server: ConsoleServer) -> None:
    submit_ticket_form(server, wait_status(server, start_turn(server, "c-phone")["id"], "WAITING_FOR_USER"))
    page.set_window_size(375, 812)
    open_console(page, server, "/conversations/c-phone")
    card(page, "agent_action", "PENDING")
    width = page.execute_script("return document.documentElement.clientWidth")
    assert page.execute_script("return document.documentElement.scrollWidth") <= width
    # Every control of the page is named by a label, and every button is a real button.
    unlabelled = page.execute_script(
        "return [...document.querySelectorAll('main input, main select, main textarea')]"
        ".filter((e) => !e.id || !document.querySelector(`label[for='${e.id}']`)).map((e) => e.outerHTML)"
    )
    assert unlabelled == []
    assert page.execute_script("return document.querySelectorAll('main [onclick], main a:not([href])').length") == 0
    screenshot(page, "console-phone-conversation")
    open_console(page, server, "/")
    wait_for(
        lambda: page.find_elements(By.CSS_SELECTOR, ".turn-list > li"), timeout=TIMEOUT, message="the waiting list"
    )
    assert page.execute_script("return document.documentElement.scrollWidth") <= width
    screenshot(page, "console-phone-waiting")


def test_tenants_see_only_their_own_turns(tmp_path_factory: pytest.TempPathFactory) -> None:
    with serve(tmp_path_factory.mktemp("console-tenants"), api_keys="tenant-a:key-aaa,tenant-b:key-bbb") as server:
        turns = {
            tenant: server.ok(
                "POST",
                "/v1/turns",
                {"agent_id": "support-desk", "input": f"help {tenant}", "conversation_id": "shared"},
                key=key,
            )
            for tenant, key in server.keys.items()
        }
        for tenant, key in server.keys.items():
            wait_status(server, turns[tenant]["id"], "WAITING_FOR_USER", key=key)
        with chromium() as browser_a, chromium() as browser_b:
            for tenant, driver in (("tenant-a", browser_a), ("tenant-b", browser_b)):
                other = "tenant-b" if tenant == "tenant-a" else "tenant-a"
                sign_in_and_see_only_own(driver, server, tenant, own=turns[tenant]["id"], other=turns[other]["id"])
            # The key stays in the tab (sessionStorage), never in the address.
            assert "key-aaa" not in browser_a.current_url
            assert browser_a.execute_script("return sessionStorage.getItem('agent-runner.api-key')") == "key-aaa"


def sign_in_and_see_only_own(driver: WebDriver, server: ConsoleServer, tenant: str, *, own: str, other: str) -> None:
    """Sign in with the tenant's key: its own turn and conversation show, the other tenant's never."""
    open_console(driver, server, "/")
    # Without a key the server answers 401 and the console asks for one.
    dialog = wait_for(
        lambda: e if (e := driver.find_element(By.ID, "sign-in")).is_displayed() else None, message="the sign-in box"
    )
    assert "needs an API key" in dialog.text
    key_input = dialog.find_element(By.ID, "api-key")
    assert driver.find_element(By.CSS_SELECTOR, "label[for='api-key']").text == "API key"
    key_input.send_keys(server.keys[tenant])
    dialog.find_element(By.XPATH, ".//button[normalize-space()='Sign in']").click()
    wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, f"li[data-turn-id='{own}']"),
        timeout=TIMEOUT,
        message=f"{tenant}'s turn",
    )
    assert driver.find_elements(By.CSS_SELECTOR, f"li[data-turn-id='{other}']") == []
    assert [e.get_attribute("data-turn-id") for e in driver.find_elements(By.CSS_SELECTOR, ".turn-list > li")] == [own]
    screenshot(driver, f"console-{tenant}")

    open_console(driver, server, "/conversations/shared")
    text = wait_for(
        lambda: t if f"help {tenant}" in (t := driver.find_element(By.CSS_SELECTOR, "ol.timeline").text) else None,
        timeout=TIMEOUT,
        message=f"{tenant}'s conversation",
    )
    other_tenant = "tenant-b" if tenant == "tenant-a" else "tenant-a"
    assert f"help {other_tenant}" not in text
    assert console_errors(driver) == []


def test_answer_a_plain_text_question(page: WebDriver, server: ConsoleServer) -> None:
    # A turn that asks in plain text (an application suspends it with AgentSuspension.user_input).
    turns = SqlAgentTurnStore(server.database_url)
    asking = AgentTurn(
        id=f"question-{uuid.uuid4().hex[:8]}",
        agent_id="echo",
        agent_version="2",
        conversation_id="c-question",
        status=AgentTurnStatus.WAITING_FOR_USER,
        suspension=AgentSuspension.user_input("Which order number is it?"),
        messages=[SystemMessage(content="Repeat what the user says."), UserMessage(content="Where is my order?")],
    )
    turns.save(asking, -1)

    open_console(page, server, "/conversations/c-question")
    question = wait_for(
        lambda: page.find_element(By.CSS_SELECTOR, "form.question-card"), timeout=TIMEOUT, message="the question"
    )
    assert "Which order number is it?" in question.text
    answer = control(question, "Your answer")
    question.find_element(By.XPATH, ".//button[normalize-space()='Send answer']").click()
    # An empty answer is refused in the page, with the error linked to the field.
    assert answer.get_attribute("aria-invalid") == "true"
    assert field_error(page, answer) == "Please write an answer."
    answer.send_keys("O-1001")
    screenshot(page, "console-question")
    question.find_element(By.XPATH, ".//button[normalize-space()='Send answer']").click()

    done = wait_status(server, asking.id, "COMPLETED")
    assert done["final_output"] == "You said: O-1001"
    wait_for(
        lambda: page.find_elements(By.CSS_SELECTOR, "form.question-card") == [],
        timeout=TIMEOUT,
        message="the question to go",
    )
    wait_for(lambda: "You said: O-1001" in final_answers(page), timeout=TIMEOUT, message="the answer in the timeline")


def refund_cut_off_by_a_crash(server: ConsoleServer, order: str, conversation_id: str) -> dict[str, Any]:
    """Start a refund whose first run kills the server after its start was saved; restart it; return the waiting turn."""
    process = server.api.process
    assert process is not None
    body = {"agent_id": "refunds", "input": f"Refund order {order}", "conversation_id": conversation_id}
    turn = server.ok("POST", "/v1/turns", body)
    wait_for(lambda: process.poll() is not None, timeout=TIMEOUT, message="the server to stop in the refund")
    server.api.restart()
    waiting = wait_status(server, turn["id"], "WAITING_FOR_APPROVAL")
    assert waiting["suspension"]["kind"] == "outcome_unknown"
    return waiting


def choice_buttons(element: WebElement) -> list[str]:
    return [b.text for b in element.find_elements(By.CSS_SELECTOR, ".decision-buttons button")]


def test_a_call_whose_outcome_is_unknown_is_retried_marked_done_or_failed(
    browser: WebDriver, tmp_path_factory: pytest.TempPathFactory
) -> None:
    workdir = tmp_path_factory.mktemp("console-crash")
    crashes = workdir / "crashes"
    crashes.mkdir()
    browser.set_window_size(1280, 900)
    with serve(workdir, AGENT_RUNNER_LEASE_TTL_S="1", **{CRASH_DIR_ENV: str(crashes)}) as server:
        # Mark done: the person found out what the call did and gives its result.
        turn = refund_cut_off_by_a_crash(server, "O-7", "c-refund-done")
        open_console(browser, server, "/")
        browser.execute_script("sessionStorage.clear(); localStorage.clear()")
        wait_for(
            lambda: (
                "Settle issue_refund (outcome unknown)"
                in browser.find_element(By.CSS_SELECTOR, f"li[data-turn-id='{turn['id']}'] h3").text
            ),
            timeout=TIMEOUT,
            message="the turn in the waiting list",
        )
        # The turn page offers the same three choices for its suspension.
        open_console(browser, server, f"/turns/{turn['id']}")
        panel = card(browser, "agent_action", "PENDING")
        assert panel.get_attribute("data-kind") == "outcome_unknown"
        assert choice_buttons(panel) == ["Retry", "Mark done", "Fail"]

        open_console(browser, server, "/conversations/c-refund-done")
        unknown = card(browser, "agent_action", "PENDING")
        assert unknown.get_attribute("data-kind") == "outcome_unknown"
        assert unknown.find_element(By.TAG_NAME, "h3").text == "Outcome unknown: issue_refund"
        assert "O-7" in unknown.text and "started but its outcome was not recorded" in unknown.text
        assert choice_buttons(unknown) == ["Retry", "Mark done", "Fail"]
        # Marking it done needs the result: refused in the page, with the error linked to the field.
        mark_done = unknown.find_element(By.XPATH, ".//button[normalize-space()='Mark done']")
        mark_done.click()
        result = control(unknown, "Result")
        assert result.get_attribute("aria-invalid") == "true"
        assert field_error(browser, result) == "Please write what the call did before marking it done."
        assert server.turn(turn["id"])["status"] == "WAITING_FOR_APPROVAL"
        result.send_keys("The bank shows refund R-7 paid")
        assert result.get_attribute("aria-invalid") is None and field_error(browser, result) == ""
        control(unknown, "Reason").send_keys("Checked the bank statement")
        control(unknown, "Your name").send_keys("Dana from IT")
        screenshot(browser, "console-outcome-unknown")
        mark_done.click()

        done = wait_status(server, turn["id"], "COMPLETED")
        assert done["final_output"] == "Done: The bank shows refund R-7 paid."
        results = [m for m in done["messages"] if m["role"] == "tool"]
        assert [(m["content"], m["is_error"]) for m in results] == [("The bank shows refund R-7 paid", False)]
        settled = card(browser, "agent_action", "SUBMITTED")
        stored = stored_card(server, "c-refund-done", "agent_action")
        assert (stored["kind"], stored["decided_by"], stored["reason"]) == (
            "outcome_unknown",
            "Dana from IT",
            "Checked the bank statement",
        )
        assert_shows_decision(settled, stored, "Marked done")
        assert settled.find_element(By.CSS_SELECTOR, ".badge").text == "Marked done"
        wait_for(lambda: done["final_output"] in final_answers(browser), timeout=TIMEOUT, message="the answer")
        screenshot(browser, "console-outcome-settled")

        # Retry: the call runs again.
        turn = refund_cut_off_by_a_crash(server, "O-8", "c-refund-retry")
        open_console(browser, server, "/conversations/c-refund-retry")
        unknown = card(browser, "agent_action", "PENDING")
        control(unknown, "Reason").send_keys("The bank has no record of it")
        control(unknown, "Your name").send_keys("Dana from IT")
        unknown.find_element(By.XPATH, ".//button[normalize-space()='Retry']").click()
        done = wait_status(server, turn["id"], "COMPLETED")
        assert done["final_output"] == "Done: refund of 25.00 for O-8 paid."
        retried = card(browser, "agent_action", "APPROVED")
        assert_shows_decision(retried, stored_card(server, "c-refund-retry", "agent_action"), "Retried")

        # Fail: the agent is told the call did not work, and why.
        turn = refund_cut_off_by_a_crash(server, "O-9", "c-refund-fail")
        open_console(browser, server, "/conversations/c-refund-fail")
        unknown = card(browser, "agent_action", "PENDING")
        control(unknown, "Reason").send_keys("The card was closed")
        control(unknown, "Your name").send_keys("Dana from IT")
        unknown.find_element(By.XPATH, ".//button[normalize-space()='Fail']").click()
        done = wait_status(server, turn["id"], "COMPLETED")
        assert done["final_output"].startswith("The refund did not go through: ")
        assert done["final_output"].endswith("The card was closed")
        failed = card(browser, "agent_action", "REJECTED")
        assert_shows_decision(failed, stored_card(server, "c-refund-fail", "agent_action"), "Failed")
        assert console_errors(browser) == []


def test_the_turn_page_shows_the_deadline_of_a_waiting_approval(page: WebDriver, server: ConsoleServer) -> None:
    started = server.ok("POST", "/v1/turns", {"agent_id": "change-desk", "input": "ship billing"})
    waiting = wait_status(server, started["id"], "WAITING_FOR_APPROVAL")
    deadline = waiting["suspension"]["deadline"]
    assert waiting["suspension"]["on_timeout"] == "reject"

    open_console(page, server, f"/turns/{started['id']}")

    note = wait_for(lambda: page.find_element(By.CSS_SELECTOR, ".deadline"), timeout=TIMEOUT, message="the deadline")
    assert note.text.startswith("Decide by ") and note.text.endswith("; then it is rejected.")
    assert note.find_element(By.TAG_NAME, "time").get_attribute("datetime") == deadline
    screenshot(page, "console-deadline")
