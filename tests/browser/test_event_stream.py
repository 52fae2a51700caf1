"""The console's event-stream client in headless Chromium, against scripted `text/event-stream` endpoints.

The client reads server-sent events through fetch() so that it can send the API key as a
header; these tests check the parsing, the reconnect after Last-Event-ID, and that a page
reload in the middle of an answer continues it with no gap and no repeat.
"""

from __future__ import annotations

import json
import time
from typing import Any

from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.browser_kit import screenshot, wait_for
from tests.browser.static_server import ScriptedStream, StaticServer, delta_stream

ANSWER = "Ticket INC-0042 is open; the on-call engineer will call you back within fifteen minutes."


def open_page(driver: WebDriver, server: StaticServer) -> None:
    driver.get(f"{server.url}/sse.html")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{server.url}/sse.html")
    wait_for(lambda: driver.execute_script("return window.harnessReady === true"), message="the test page")


def streamed_text(driver: WebDriver) -> str:
    text: str = driver.execute_script("return document.querySelector('#live li .bubble')?.textContent || ''")
    return text


def test_events_are_parsed_and_the_stream_resumes_after_a_dropped_connection(
    browser: WebDriver, static_server: StaticServer
) -> None:
    stream = static_server.streams.add(
        "parse", delta_stream("abcdefghij", chunk=2, interval=0.05, drop_after={"c0002"})
    )
    open_page(browser, static_server)

    browser.execute_script("return window.sseHarness.raw('parse', 'key-123')")

    wait_for(
        lambda: browser.execute_script("return window.sseHarness.states.includes('ended')"), message="the end event"
    )
    events: list[dict[str, Any]] = browser.execute_script("return window.sseHarness.events")
    assert [e["id"] for e in events] == [f"c{n:04d}" for n in range(1, 8)] + ["c0007"]
    assert [e["type"] for e in events] == ["MODEL_DELTA"] * 5 + ["MODEL_RESPONSE", "TURN_COMPLETED", "end"]
    assert "".join(json.loads(e["data"])["data"]["delta"] for e in events[:5]) == "abcdefghij"
    assert json.loads(events[5]["data"])["data"]["content"] == "abcdefghij"
    # One reconnect after the drop, after the last event seen, with the key as a header each time.
    assert stream.requests == [
        {"authorization": "Bearer key-123", "last_event_id": None},
        {"authorization": "Bearer key-123", "last_event_id": "c0002"},
    ]
    states: list[str] = browser.execute_script("return window.sseHarness.states")
    assert states == ["connecting", "open", "retrying", "connecting", "open", "ended"]


def test_a_reload_mid_answer_continues_from_the_saved_cursor(browser: WebDriver, static_server: StaticServer) -> None:
    stream = static_server.streams.add("reload", delta_stream(ANSWER, chunk=4, interval=0.12, end=False))
    open_page(browser, static_server)
    browser.execute_script("sessionStorage.setItem('agent-runner.api-key', 'key-xyz')")
    browser.execute_script("return window.sseHarness.live('reload')")

    before = wait_for(lambda: t if len(t := streamed_text(browser)) >= 20 else None, message="part of the answer")
    assert ANSWER.startswith(before)
    screenshot(browser, "event-stream-partial")
    browser.refresh()
    wait_for(lambda: browser.execute_script("return window.harnessReady === true"), message="the reloaded page")
    browser.execute_script("return window.sseHarness.live('reload')")

    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = streamed_text(browser)
        if text and (not seen or seen[-1] != text):
            seen.append(text)
            assert ANSWER.startswith(text), f"gap or repeat after the reload: {text!r}"
        if text == ANSWER and not browser.execute_script("return !!document.querySelector('#live li.msg-streaming')"):
            break
        time.sleep(0.02)
    assert seen and seen[0].startswith(before), "the partial answer was not restored at once"
    assert seen[-1] == ANSWER
    # The second connection asked for what came after the last event the first page saw.
    assert [r["authorization"] for r in stream.requests] == ["Bearer key-xyz", "Bearer key-xyz"]
    resumed_after = stream.requests[1]["last_event_id"]
    assert resumed_after is not None and resumed_after.startswith("c")
    final = {"cursor": f"c{len(stream.events):04d}", "partials": {}, "queued": {}}

    def saved() -> Any:
        return json.loads(browser.execute_script("return sessionStorage.getItem('agent-runner.stream.test.reload')"))

    wait_for(lambda: saved() == final, message=f"the saved position to reach {final}")
    assert browser.execute_script("return document.querySelectorAll('#live li').length") == 1


def test_the_whole_text_of_model_response_replaces_deltas_that_were_missed(
    browser: WebDriver, static_server: StaticServer
) -> None:
    # Deltas are live only: a client that connects late, or whose deltas expired, gets some.
    full = delta_stream(ANSWER, chunk=10, interval=0.05)
    deltas = [e for e in full.events if e["type"] == "MODEL_DELTA"]
    kept = deltas[:3] + [e for e in full.events if e["type"] != "MODEL_DELTA"]
    static_server.streams.add("missed", ScriptedStream(events=kept, interval=0.05))
    open_page(browser, static_server)
    browser.execute_script("return window.sseHarness.live('missed')")

    wait_for(
        lambda: browser.execute_script("return window.sseHarness.events.includes('TURN_COMPLETED')"),
        message="the end of the answer",
    )
    assert streamed_text(browser) == ANSWER
    assert browser.execute_script("return document.querySelectorAll('#live li.msg-streaming').length") == 0
    assert browser.execute_script("return document.querySelector('#live li').dataset.messageId") == "m-1"


def queued_labels(driver: WebDriver) -> dict[str, str]:
    labels: dict[str, str] = driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#live li.msg-queued')]"
        ".map((li) => [li.querySelector('.bubble').textContent, li.querySelector('.who').textContent]))"
    )
    return labels


def test_queued_messages_show_their_place_in_line_until_their_turn_starts_or_they_fail(
    browser: WebDriver, static_server: StaticServer
) -> None:
    # Three messages queued behind a busy conversation; the first starts, the second fails
    events: list[dict[str, Any]] = [
        {"type": "MESSAGE_QUEUED", "turn_id": f"q{n}", "data": {"message_id": f"m{n}", "sequence": n, "ahead": n - 1}}
        for n in (1, 2, 3)
    ]
    for number, event in enumerate(events, start=1):
        event["data"]["content"] = f"question {number}"
    events += [
        {"type": "TURN_STARTED", "turn_id": "q1", "data": {"message_id": "m1", "queued_message_id": "m1"}},
        {"type": "MESSAGE_FAILED", "turn_id": "q2", "data": {"message_id": "m2", "error": "no such agent"}},
    ]
    for number, event in enumerate(events, start=1):
        event["id"] = f"c{number:04d}"
    static_server.streams.add("queued", ScriptedStream(events=events, interval=0.6))
    open_page(browser, static_server)
    browser.execute_script("return window.sseHarness.live('queued')")

    wait_for(lambda: len(queued_labels(browser)) == 3, message="the three queued messages")
    assert queued_labels(browser) == {
        "question 1": "You · queued, next in line",
        "question 2": "You · queued, 2 in line",
        "question 3": "You · queued, 3 in line",
    }
    wait_for(
        lambda: browser.execute_script("return window.sseHarness.events.includes('MESSAGE_FAILED')"),
        message="the failure of the second message",
    )
    expected = {"question 2": "You · not sent: no such agent", "question 3": "You · queued, next in line"}
    assert queued_labels(browser) == expected
    # A reload keeps what the stream told (it resumes after the last event, which it does not send again)
    browser.refresh()
    wait_for(lambda: browser.execute_script("return window.harnessReady === true"), message="the reloaded page")
    browser.execute_script("return window.sseHarness.live('queued')")
    assert queued_labels(browser) == expected
