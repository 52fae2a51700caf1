"""The unmodified Python `langgraph-sdk` (sync and async clients) against a real `agent-runner serve` (embedded)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.schema import StreamPart

from tests.helpers.api_server import ApiServer
from tests.integration.langgraph.langgraph_agents import story

pytestmark = pytest.mark.integration

Client = Any
"""The sync client as the tests use it: its answers are TypedDict unions (a run's values or a list) indexed freely."""


@pytest.fixture
def client(server: ApiServer) -> Iterator[SyncLangGraphClient]:
    with get_sync_client(url=server.url, api_key=None) as client:
        yield client


def refused(call: Callable[[], object], status: int) -> dict[str, Any]:
    """The error body of a call the server refused with `status` (typed SDK errors are HTTPStatusErrors too)."""
    with pytest.raises(httpx.HTTPStatusError) as raised:
        call()
    assert raised.value.response.status_code == status, raised.value.response.text
    error: dict[str, Any] = raised.value.response.json()["error"]
    return error


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def texts(values: Any) -> list[tuple[str, str]]:
    return [(m["type"], m["content"]) for m in values["messages"]]


def test_assistants_are_the_agents_with_their_versions_and_schemas(client: Client) -> None:
    # When the client lists the assistants
    found = {a["assistant_id"]: a for a in client.assistants.search(limit=50)}
    # Then each agent is one, graph_id = the agent id, version from the agent
    assert {"desk", "helper", "writer"} <= set(found)
    assert found["desk"]["graph_id"] == "desk" and found["desk"]["version"] == 2
    assert found["desk"]["metadata"]["agent_version"] == "2"
    assert client.assistants.search(graph_id="writer")[0]["assistant_id"] == "writer"
    assert client.assistants.get("desk")["graph_id"] == "desk"
    schemas = client.assistants.get_schemas("desk")
    assert schemas["graph_id"] == "desk" and "messages" in schemas["input_schema"]["properties"]
    assert [form["key"] for form in schemas["state_schema"]["x-forms"]] == ["ticket_details"]
    refused(lambda: client.assistants.get("nobody"), 404)
    # Parts of the protocol that do not fit agents answer a typed 501
    with pytest.raises(httpx.HTTPStatusError) as raised:
        client.assistants.get_graph("desk")
    assert raised.value.response.status_code == 501
    assert raised.value.response.json()["error"]["type"] == "NotSupported"


def test_threads_are_created_found_searched_patched_and_deleted(client: Client) -> None:
    tag = uuid.uuid4().hex
    thread_id = f"t-{tag}"
    # Given a thread created with an id and metadata
    created = client.threads.create(thread_id=thread_id, metadata={"tag": tag, "user": "ann"})
    assert created["thread_id"] == thread_id and created["status"] == "idle"
    assert created["values"] == {"messages": []} and created["metadata"] == {"tag": tag, "user": "ann"}
    # A second create raises unless if_exists=do_nothing
    refused(lambda: client.threads.create(thread_id=thread_id), 409)
    assert client.threads.create(thread_id=thread_id, if_exists="do_nothing")["metadata"]["user"] == "ann"
    other = client.threads.create(metadata={"tag": tag, "user": "bob"})
    # When it runs, the thread holds the conversation
    client.runs.wait(thread_id, "desk", input=user("hello"))
    got = client.threads.get(thread_id)
    assert texts(got["values"]) == [("human", "hello"), ("ai", "echo: hello")]
    # Search filters by metadata and status, with limit and offset
    both = client.threads.search(metadata={"tag": tag})
    assert {t["thread_id"] for t in both} == {thread_id, other["thread_id"]}
    assert [t["thread_id"] for t in client.threads.search(metadata={"tag": tag, "user": "bob"})] == [other["thread_id"]]
    assert len(client.threads.search(metadata={"tag": tag}, limit=1)) == 1
    assert len(client.threads.search(metadata={"tag": tag}, limit=1, offset=1)) == 1
    assert client.threads.search(metadata={"tag": tag}, status="busy") == []
    assert len(client.threads.search(metadata={"tag": tag}, status="idle")) == 2
    # Patch merges metadata
    patched = client.threads.update(thread_id, metadata={"stage": "done"})
    assert patched["metadata"] == {"tag": tag, "user": "ann", "stage": "done"}
    # Delete: gone for the API, and the id is not handed out again
    client.threads.delete(thread_id)
    refused(lambda: client.threads.get(thread_id), 404)
    refused(lambda: client.threads.create(thread_id=thread_id), 409)
    assert [t["thread_id"] for t in client.threads.search(metadata={"tag": tag})] == [other["thread_id"]]


def test_thread_search_pages_sorts_and_filters_by_status_ids_and_metadata(client: Client) -> None:
    tag = uuid.uuid4().hex
    names = [f"{tag}-{number}" for number in range(7)]
    for name in names:
        client.threads.create(thread_id=name, metadata={"tag": tag, "odd": int(name[-1]) % 2 == 1})
    client.runs.wait(names[3], "writer", input=user("fail"), raise_error=False)
    # Pages in the order asked for, each thread once
    pages = [
        client.threads.search(metadata={"tag": tag}, limit=3, offset=offset, sort_by="thread_id", sort_order="asc")
        for offset in (0, 3, 6)
    ]
    assert [[t["thread_id"] for t in page] for page in pages] == [names[0:3], names[3:6], names[6:]]
    newest = client.threads.search(metadata={"tag": tag}, limit=2, sort_by="created_at", sort_order="desc")
    assert [t["thread_id"] for t in newest] == [names[6], names[5]]
    assert client.threads.search(metadata={"tag": tag}, limit=1, sort_by="updated_at")[0]["thread_id"] == names[3]
    # Filters: status (from the newest run), ids, metadata values of any JSON type
    failed = client.threads.search(metadata={"tag": tag}, status="error")
    assert [t["thread_id"] for t in failed] == [names[3]] and failed[0]["status"] == "error"
    assert client.threads.count(metadata={"tag": tag}, status="idle") == 6
    assert client.threads.count(metadata={"tag": tag, "odd": True}) == 3
    found = client.threads.search(ids=[names[1], names[2], "not-a-thread"], sort_by="thread_id", sort_order="asc")
    assert [t["thread_id"] for t in found] == [names[1], names[2]]
    error = refused(lambda: client.threads.search(values={"messages": []}), 501)
    assert error["type"] == "NotSupported" and "values" in error["message"]
    refused(lambda: client.threads.search(sort_by="nothing"), 422)


def test_a_streamed_run_prints_tokens_and_sends_values_updates_and_messages(server: ApiServer) -> None:
    async def scenario() -> list[StreamPart]:
        async with get_client(url=server.url, api_key=None) as async_client:
            client: Client = async_client
            thread = await client.threads.create()
            parts = []
            async for part in client.runs.stream(
                thread["thread_id"],
                "writer",
                input=user("story 12"),
                stream_mode=["values", "updates", "messages-tuple"],
            ):
                parts.append(part)
            return parts

    parts = asyncio.run(scenario())
    events = [part.event for part in parts]
    assert events[0] == "metadata" and events[-1] == "end"
    # Then the tokens come as message chunks, adding up to the answer
    chunks = [part.data[0] for part in parts if part.event == "messages"]
    assert chunks and all(chunk["type"] == "AIMessageChunk" for chunk in chunks)
    assert "".join(chunk["content"] for chunk in chunks) == story(12)
    print("".join(chunk["content"] for chunk in chunks))
    # The updates name the node, the values are the whole thread
    updates = [part.data for part in parts if part.event == "updates"]
    assert updates == [{"model": {"messages": [updates[0]["model"]["messages"][0]]}}]
    assert updates[0]["model"]["messages"][0]["content"] == story(12)
    values = [part.data for part in parts if part.event == "values"]
    assert texts(values[0]) == [("human", "story 12")]
    assert texts(values[-1]) == [("human", "story 12"), ("ai", story(12))]


def test_form_and_approval_interrupts_show_in_the_state_and_resume_with_commands(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    # Given a run that asks for a form
    parts = list(client.runs.stream(thread_id, "desk", input=user("ticket for the db"), stream_mode="updates"))
    assert [p.event for p in parts] == ["metadata", "updates", "updates", "end"]
    (interrupt,) = parts[2].data["__interrupt__"]
    # Then the thread is interrupted, and its state carries the frozen schema
    assert client.threads.get(thread_id)["status"] == "interrupted"
    # A client that joins after the interrupt went out gets the end of the run's stream at once
    time.sleep(1.2)
    run_id = parts[0].data["run_id"]
    assert [p.event for p in client.runs.join_stream(thread_id, run_id, last_event_id=parts[2].id)] == ["end"]
    state = client.threads.get_state(thread_id)
    assert state["next"] == ["tools"] and state["interrupts"] == [interrupt]
    assert state["tasks"][0]["interrupts"] == [interrupt]
    form = interrupt["value"]
    assert form["type"] == "form" and form["form_key"] == "ticket_details"
    assert form["response_schema"]["required"] == ["system", "scope"]
    assert state["values"]["messages"][-1]["tool_calls"][0]["name"] == "request_user_input"
    # Form data that fails the schema is a 422 with a detail per field; nothing changes
    raised = refused(
        lambda: client.runs.wait(thread_id, "desk", command={"resume": {"system": "d", "scope": "SOME"}}), 422
    )
    paths = {d["path"] for d in raised["details"]}
    assert paths == {"/system", "/scope"}
    assert client.threads.get(thread_id)["status"] == "interrupted"
    # When the form is resumed with its data, the approval interrupt follows in the HITL shape
    values = client.runs.wait(thread_id, "desk", command={"resume": {"system": "db", "scope": "ALL_USERS"}})
    (approval,) = values["__interrupt__"]
    request = approval["value"]["action_requests"][0]
    assert request["name"] == "open_ticket"
    assert request["args"] == {"system": "db", "scope": "ALL_USERS", "api_token": "***"}
    assert approval["value"]["review_configs"] == [
        {"action_name": "open_ticket", "allowed_decisions": ["approve", "edit", "reject"]}
    ]
    assert client.threads.get_state(thread_id)["interrupts"] == [approval]
    # An edit whose arguments fail the tool's schema is a 422 naming the field; nothing changes
    bad_edit = {"name": "open_ticket", "args": {"system": "db", "scope": "EVERYONE", "api_token": "***"}}
    error = refused(
        lambda: client.runs.wait(
            thread_id, "desk", command={"resume": {"decisions": [{"type": "edit", "edited_action": bad_edit}]}}
        ),
        422,
    )
    assert [d["path"] for d in error["details"]] == ["/scope"]
    refused(lambda: client.runs.wait(thread_id, "desk", command={"resume": {"decisions": [{"type": "maybe"}]}}), 422)
    # A reject with a message reaches the model, which answers; the run is the same turn
    run_id = client.runs.list(thread_id)[0]["run_id"]
    final = client.runs.wait(
        thread_id, "desk", command={"resume": {"decisions": [{"type": "reject", "message": "not today"}]}}
    )
    assert final["messages"][-1]["content"].startswith("not opened:")
    assert final["messages"][-1]["content"].endswith("not today")
    assert final["messages"][-2]["type"] == "tool" and final["messages"][-2]["status"] == "error"
    assert "__interrupt__" not in final
    assert client.runs.get(thread_id, run_id)["status"] == "success"
    assert client.threads.get(thread_id)["status"] == "idle"
    # Resuming again is a conflict: nothing waits
    refused(lambda: client.runs.wait(thread_id, "desk", command={"resume": {"decisions": [{"type": "approve"}]}}), 409)


def test_approve_decision_runs_the_recorded_call(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "desk", input=user("ticket"))
    client.runs.wait(thread_id, "desk", command={"resume": {"system": "mail", "scope": "ONE_USER"}})
    final = client.runs.wait(thread_id, "desk", command={"resume": {"decisions": [{"type": "approve"}]}})
    assert final["messages"][-1]["content"] == "opened TICKET-mail-ONE_USER"


def test_edit_decision_runs_the_edited_call_and_keeps_masked_arguments(client: Client, server: ApiServer) -> None:
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "desk", input=user("ticket"))
    waiting = client.runs.wait(thread_id, "desk", command={"resume": {"system": "mail", "scope": "ONE_USER"}})
    shown = waiting["__interrupt__"][0]["value"]["action_requests"][0]["args"]
    # When a person widens the scope, sending the masked token back as it was shown
    edited = {"name": "open_ticket", "args": {**shown, "scope": "ALL_USERS"}}
    final = client.runs.wait(
        thread_id,
        "desk",
        command={"resume": {"decisions": [{"type": "edit", "edited_action": edited}]}},
        metadata={"decided_by": "ops-lead", "reason": "it hits everyone"},
    )
    # Then the edited call ran (the model was not asked again) and the answer follows from it
    assert final["messages"][-1]["content"] == "opened TICKET-mail-ALL_USERS"
    assert final["messages"][-2]["type"] == "tool" and final["messages"][-2]["content"] == "TICKET-mail-ALL_USERS"
    # And the decision is recorded with who and why
    with httpx.Client(base_url=server.url) as raw:
        cards = raw.get(f"/v1/conversations/{thread_id}/messages").json()["items"]
    (card,) = [item for item in cards if item["role"] == "agent_action"]
    assert (card["status"], card["decided_by"], card["reason"]) == ("APPROVED", "ops-lead", "it hits everyone")


def test_join_stream_with_last_event_id_misses_and_repeats_nothing(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    modes = ["values", "updates", "messages-tuple"]
    # Given a client that drops the stream after a few tokens
    received: list[StreamPart] = []
    run_id = ""
    stream = client.runs.stream(thread_id, "writer", input=user("story 30"), stream_mode=modes, stream_resumable=True)
    assert isinstance(stream, Generator)
    for part in stream:
        received.append(part)
        if part.event == "metadata":
            run_id = part.data["run_id"]
        if part.event == "messages" and len([p for p in received if p.event == "messages"]) == 5:
            break
    stream.close()
    last_id = received[-1].id
    assert run_id and last_id
    # When it joins again from its last event id
    rest = list(client.runs.join_stream(thread_id, run_id, stream_mode=modes, last_event_id=last_id))
    # Then together they are exactly the whole stream, as a full replay shows it
    whole = list(client.runs.join_stream(thread_id, run_id, stream_mode=modes))
    assert [(p.event, p.data) for p in received + rest] == [(p.event, p.data) for p in whole]
    # `-1` is what the SDKs send to rejoin a run from its start after a page reload
    rejoined = list(client.runs.join_stream(thread_id, run_id, stream_mode=modes, last_event_id="-1"))
    assert [(p.event, p.data) for p in rejoined] == [(p.event, p.data) for p in whole]
    tokens = "".join(p.data[0]["content"] for p in received + rest if p.event == "messages")
    assert tokens == story(30)


def test_runs_are_listed_got_joined_and_the_history_has_a_state_per_turn(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    first = client.runs.create(thread_id, "desk", input=user("one"))
    assert first["status"] in ("pending", "running", "success") and first["thread_id"] == thread_id
    joined = client.runs.join(thread_id, first["run_id"])
    assert texts(joined)[-1] == ("ai", "echo: one")
    # Earlier messages sent with the input must be the thread's history
    second = client.runs.wait(
        thread_id,
        "desk",
        input={
            "messages": [
                {"type": "human", "content": "one"},
                {"type": "ai", "content": "echo: one"},
                {"type": "human", "content": [{"type": "text", "text": "two"}]},
            ]
        },
    )
    assert texts(second) == [("human", "one"), ("ai", "echo: one"), ("human", "two"), ("ai", "echo: two")]
    refused(
        lambda: client.runs.wait(
            thread_id,
            "desk",
            input={"messages": [{"role": "user", "content": "never said"}, {"role": "user", "content": "three"}]},
        ),
        422,
    )
    runs = client.runs.list(thread_id)
    assert [r["status"] for r in runs] == ["success", "success"] and runs[1]["run_id"] == first["run_id"]
    assert client.runs.get(thread_id, first["run_id"])["assistant_id"] == "desk"
    assert len(client.runs.list(thread_id, limit=1, offset=1)) == 1
    refused(lambda: client.runs.get(thread_id, "no-such-run"), 404)
    history = client.threads.get_history(thread_id)
    assert [len(state["values"]["messages"]) for state in history] == [4, 2]
    assert history[1]["metadata"]["run_id"] == first["run_id"]


def test_stateless_runs_create_a_thread(client: Client) -> None:
    values = client.runs.wait(None, "desk", input=user("alone"))
    assert texts(values) == [("human", "alone"), ("ai", "echo: alone")]
    parts = list(client.runs.stream(None, "desk", input=user("also alone"), stream_mode="values"))
    assert texts(parts[-2].data)[-1] == ("ai", "echo: also alone")


def test_multitask_strategies_map_onto_the_busy_conversation_policies(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    slow = client.runs.create(thread_id, "desk", input=user("sleep 3"))
    # reject: 409 while the thread is busy
    refused(lambda: client.runs.create(thread_id, "desk", input=user("now"), multitask_strategy="reject"), 409)
    assert client.threads.get(thread_id)["status"] == "busy"
    # rollback: refused with a typed 422
    raised = refused(
        lambda: client.runs.create(thread_id, "desk", input=user("now"), multitask_strategy="rollback"), 422
    )
    assert raised["type"] == "RollbackNotSupported"
    # enqueue: pending until the conversation frees, then it runs
    queued = client.runs.create(thread_id, "desk", input=user("later"), multitask_strategy="enqueue")
    assert queued["status"] == "pending"
    assert texts(client.runs.join(thread_id, queued["run_id"]))[-1] == ("ai", "echo: later")
    assert client.runs.get(thread_id, slow["run_id"])["status"] == "success"
    # interrupt: the active run is cancelled with close-out, the new one runs
    busy = client.runs.create(thread_id, "desk", input=user("sleep 3"))
    fresh = client.runs.wait(thread_id, "desk", input=user("instead"), multitask_strategy="interrupt")
    assert texts(fresh)[-1] == ("ai", "echo: instead")
    assert client.runs.get(thread_id, busy["run_id"])["status"] == "interrupted"


def test_the_steer_strategy_gives_the_input_to_the_thread_active_run(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    slow = client.runs.create(thread_id, "desk", input=user("sleep 2"))
    # steer (this server's strategy): no new run; the active one reads the input before its next model call
    steered = client.runs.create(thread_id, "desk", input=user("then stop"), multitask_strategy="steer")
    assert steered["run_id"] == slow["run_id"]
    assert texts(client.runs.join(thread_id, slow["run_id"]))[-1] == ("ai", "echo: then stop")
    assert [r["run_id"] for r in client.runs.list(thread_id)] == [slow["run_id"]]
    # With no active run, steer starts one
    fresh = client.runs.wait(thread_id, "desk", input=user("hello"), multitask_strategy="steer")
    assert texts(fresh)[-1] == ("ai", "echo: hello")


def test_cancel_ends_the_run_and_rollback_is_refused(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, "desk", input=user("sleep 5"))
    refused(lambda: client.runs.cancel(thread_id, run["run_id"], action="rollback"), 422)
    client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert client.runs.get(thread_id, run["run_id"])["status"] == "interrupted"
    assert client.threads.get(thread_id)["status"] == "idle"
    # The history is closed out: the model's last word says the turn did not finish
    assert client.threads.get_state(thread_id)["values"]["messages"][-1]["type"] == "ai"
    refused(lambda: client.runs.cancel(thread_id, run["run_id"]), 409)
    with pytest.raises(httpx.HTTPStatusError) as deleted:
        client.runs.delete(thread_id, run["run_id"])
    assert deleted.value.response.status_code == 501


def test_subgraph_streams_carry_the_child_namespace(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    parts = list(
        client.runs.stream(
            thread_id, "desk", input=user("delegate sum it up"), stream_mode="updates", stream_subgraphs=True
        )
    )
    child = [p for p in parts if p.event.startswith("updates|helper:")]
    assert child and child[0].data["model"]["messages"][0]["content"] == "echo: sum it up"
    root = [p for p in parts if p.event == "updates"]
    assert root[-1].data["model"]["messages"][0]["content"] == "helper said: echo: sum it up"
    plain = list(client.runs.stream(thread_id, "desk", input=user("delegate again"), stream_mode="updates"))
    assert not [p for p in plain if "|" in p.event]


def test_unsupported_options_and_bad_input_are_typed_errors(client: Client, server: ApiServer) -> None:
    thread_id = client.threads.create()["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as raised:
        list(client.runs.stream(thread_id, "desk", input=user("x"), stream_mode="tasks"))
    assert raised.value.response.status_code == 501
    refused(lambda: client.runs.wait(thread_id, "desk", input={"messages": []}), 422)
    refused(
        lambda: client.runs.wait(thread_id, "desk", input={"messages": [{"role": "assistant", "content": "hi"}]}), 422
    )
    refused(lambda: client.runs.wait(thread_id, "nobody", input=user("x")), 404)
    refused(lambda: client.runs.wait("no-such-thread", "desk", input=user("x")), 404)
    created = client.runs.wait("made-on-demand-" + uuid.uuid4().hex, "desk", input=user("x"), if_not_exists="create")
    assert texts(created)[-1] == ("ai", "echo: x")
    with httpx.Client(base_url=server.url) as raw:
        answer = raw.post(f"/threads/{thread_id}/runs", json={"assistant_id": "desk", "surprise": 1})
        assert answer.status_code == 422 and answer.json()["error"]["details"][0]["path"] == "/surprise"


def test_custom_mode_streams_tool_progress_and_tool_messages_come_in_messages_mode(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    parts = list(
        client.runs.stream(thread_id, "writer", input=user("count 3"), stream_mode=["custom", "messages-tuple"])
    )
    assert [p.data for p in parts if p.event == "custom"] == [{"step": 1}, {"step": 2}, {"step": 3}]
    messages = [p.data[0] for p in parts if p.event == "messages"]
    assert [(m["type"], m["content"]) for m in messages] == [("ai", ""), ("tool", "counted 3"), ("ai", "counted 3")]
    assert messages[1]["tool_call_id"] == "count-1" and parts[-1].event == "end"


def test_a_failed_run_sends_an_error_event_and_the_thread_is_in_error(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    parts = list(client.runs.stream(thread_id, "writer", input=user("fail"), stream_mode="values"))
    assert [p.event for p in parts][-2:] == ["error", "end"]
    assert parts[-2].data["error"] == "TURN_FAILED" and "cannot write that" in parts[-2].data["message"]
    assert client.threads.get(thread_id)["status"] == "error"
    assert client.runs.list(thread_id)[0]["status"] == "error"
    waited = client.runs.wait(thread_id, "writer", input=user("fine now"))
    assert waited["messages"][-1]["content"] == "wrote: fine now"
    assert client.threads.get(thread_id)["status"] == "idle"


def test_parts_of_the_protocol_not_offered_answer_501_naming_them(client: Client) -> None:
    thread_id = client.threads.create(metadata={"count": "me"})["thread_id"]
    assert client.threads.count(metadata={"count": "me"}) == 1
    calls = {
        "copying a thread": lambda: client.threads.copy(thread_id),
        "the key-value store": lambda: client.store.put_item(["ns"], "key", {"v": 1}),
        "cancelling several runs at once": lambda: client.runs.cancel_many(thread_id=thread_id, run_ids=["r"]),
        "deleting an assistant": lambda: client.assistants.delete("desk"),
    }
    for what, call in calls.items():
        error = refused(call, 501)
        assert error["type"] == "NotSupported" and what in error["message"]


def test_messages_mode_sends_partial_then_complete_messages(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    parts = list(client.runs.stream(thread_id, "writer", input=user("story 5"), stream_mode="messages"))
    events = [p.event for p in parts]
    assert events[1] == "messages/metadata" and events[-2] == "messages/complete"
    partials = [p.data[0]["content"] for p in parts if p.event == "messages/partial"]
    assert partials == [story(n) for n in range(1, 6)]
    assert parts[-2].data[0]["content"] == story(5) and parts[-2].data[0]["type"] == "ai"


def test_on_disconnect_cancel_ends_the_run_when_the_client_leaves(client: Client) -> None:
    thread_id = client.threads.create()["thread_id"]
    stream = client.runs.stream(
        thread_id, "writer", input=user("story 200"), stream_mode="messages-tuple", on_disconnect="cancel"
    )
    run_id = ""
    for part in stream:
        run_id = part.data["run_id"] if part.event == "metadata" else run_id
        if part.event == "messages":
            break
    stream.close()
    deadline = time.monotonic() + 20
    while client.runs.get(thread_id, run_id)["status"] != "interrupted" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.runs.get(thread_id, run_id)["status"] == "interrupted"
    # Without it (the default), a client that leaves does not end the run
    kept = client.runs.stream(thread_id, "writer", input=user("story 10"), stream_mode="messages-tuple")
    kept_id = next(p.data["run_id"] for p in kept if p.event == "metadata")
    kept.close()
    assert client.runs.join(thread_id, kept_id)["messages"][-1]["content"] == story(10)
