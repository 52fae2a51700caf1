"""The `events` and `debug` stream modes through the unmodified Python `langgraph-sdk`, alone and with other modes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from tests.helpers.api_server import ApiServer
from tests.integration.langgraph.langgraph_agents import story

pytestmark = pytest.mark.integration

Client = Any


@pytest.fixture
def client(server: ApiServer) -> Iterator[SyncLangGraphClient]:
    with get_sync_client(url=server.url, api_key=None) as client:
        yield client


def _stream(client: Client, agent: str, text: str, modes: list[str], **options: Any) -> list[Any]:
    thread_id = client.threads.create()["thread_id"]
    message = {"messages": [{"role": "user", "content": text}]}
    return list(client.runs.stream(thread_id, agent, input=message, stream_mode=modes, **options))


def test_events_mode_shows_the_turn_its_model_calls_tools_and_progress(client: Client) -> None:
    parts = _stream(client, "writer", "count 2", ["events"])
    run_id = parts[0].data["run_id"]
    events = [p.data for p in parts if p.event == "events"]
    assert [p.event for p in parts] == ["metadata", *["events"] * len(events), "end"]
    assert [(e["event"], e["name"]) for e in events] == [
        ("on_chain_start", "writer"),
        ("on_chat_model_start", "model"),
        ("on_chat_model_end", "model"),
        ("on_tool_start", "count_up"),
        ("on_custom_event", "count_up"),
        ("on_custom_event", "count_up"),
        ("on_tool_end", "count_up"),
        ("on_chat_model_start", "model"),
        ("on_chat_model_stream", "model"),
        ("on_chat_model_end", "model"),
        ("on_chain_end", "writer"),
    ]
    for event in events:
        assert set(event) == {"event", "name", "run_id", "tags", "metadata", "data", "parent_ids"}
        assert event["metadata"]["thread_id"] and event["metadata"]["run_id"] == run_id
        # The turn is the outer run: everything else names it as its parent
        assert event["parent_ids"] == ([] if event["run_id"] == run_id else [run_id])
    chain_start, model_start, model_end, tool_start, progress, _, tool_end, _, stream, _, chain_end = events
    assert chain_start["run_id"] == run_id and chain_start["data"]["input"]["messages"][0]["content"] == "count 2"
    assert model_start["run_id"] == model_end["run_id"] == f"{run_id}:model-1"
    assert model_end["data"]["output"]["tool_calls"][0]["name"] == "count_up"
    assert tool_start["run_id"] == tool_end["run_id"] == "count-1" and tool_start["data"]["input"] == {"times": 2}
    assert progress["data"] == {"data": {"step": 1}} and progress["run_id"] == "count-1"
    assert tool_end["data"]["output"]["type"] == "tool" and tool_end["data"]["output"]["content"] == "counted 2"
    assert stream["data"]["chunk"]["type"] == "AIMessageChunk" and stream["data"]["chunk"]["content"] == "counted 2"
    assert stream["run_id"] == f"{run_id}:model-2"
    final = chain_end["data"]["output"]["messages"]
    assert [(m["type"], m["content"]) for m in final] == [
        ("human", "count 2"),
        ("ai", ""),
        ("tool", "counted 2"),
        ("ai", "counted 2"),
    ]


def test_debug_mode_sends_checkpoints_tasks_and_task_results(client: Client) -> None:
    parts = _stream(client, "writer", "count 2", ["debug"])
    run_id = parts[0].data["run_id"]
    debug = [p.data for p in parts if p.event == "debug"]
    assert [(d["type"], d["step"]) for d in debug] == [
        ("checkpoint", -1),
        ("task", 0),
        ("task_result", 0),
        ("checkpoint", 0),
        ("task", 1),
        ("task_result", 1),
        ("checkpoint", 1),
        ("task", 2),
        ("task_result", 2),
        ("checkpoint", 2),
    ]
    assert all(set(d) == {"type", "timestamp", "step", "payload"} and d["timestamp"] for d in debug)
    start, model_task, model_result, after_model, tool_task, tool_result, after_tool, *_, last = debug
    assert start["payload"]["metadata"] == {"source": "input", "step": -1, "run_id": run_id}
    assert start["payload"]["next"] == ["model"] and start["payload"]["values"]["messages"][0]["content"] == "count 2"
    assert model_task["payload"]["id"] == model_result["payload"]["id"] == f"{run_id}:model-1"
    assert model_task["payload"]["name"] == "model" and model_result["payload"]["error"] is None
    ((channel, [answer]),) = model_result["payload"]["result"]
    assert channel == "messages" and answer["tool_calls"][0]["args"] == {"times": 2}
    assert after_model["payload"]["next"] == ["tools"]
    assert after_model["payload"]["config"]["configurable"]["checkpoint_id"] == answer["id"]
    assert tool_task["payload"] == {
        "id": "count-1",
        "name": "tools",
        "input": {"name": "count_up", "args": {"times": 2}, "id": "count-1"},
        "triggers": ["branch:to:tools"],
    }
    assert tool_result["payload"]["result"][0][1][0]["content"] == "counted 2"
    assert after_tool["payload"]["next"] == ["model"] and after_tool["payload"]["metadata"]["source"] == "loop"
    assert last["payload"]["next"] == [] and last["payload"]["values"]["messages"][-1]["content"] == "counted 2"


def test_a_failed_run_shows_its_error_in_the_debug_checkpoint(client: Client) -> None:
    parts = _stream(client, "writer", "fail", ["debug"])
    assert [p.event for p in parts] == ["metadata", "debug", "debug", "error", "end"]
    failed = parts[2].data["payload"]
    assert failed["next"] == ["model"] and "cannot write that" in failed["tasks"][0]["error"]


def test_several_modes_at_once_share_one_stream(client: Client) -> None:
    parts = _stream(client, "writer", "story 4", ["events", "debug", "messages-tuple", "values"])
    kinds = {p.event for p in parts}
    assert kinds == {"metadata", "events", "debug", "messages", "values", "end"}
    streamed = [p.data for p in parts if p.event == "events" and p.data["event"] == "on_chat_model_stream"]
    chunks = [p.data[0] for p in parts if p.event == "messages"]
    assert "".join(e["data"]["chunk"]["content"] for e in streamed) == story(4)
    assert [c["content"] for c in chunks] == [e["data"]["chunk"]["content"] for e in streamed]
    assert len({e["run_id"] for e in streamed}) == 1 and len({c["id"] for c in chunks}) == 1
    # Each event's parts come together: a chunk in `events` right before the same chunk in `messages-tuple`
    order = [p.event for p in parts if p.event in ("events", "messages")]
    assert "events,messages,events,messages" in ",".join(order)
    assert [p.data["type"] for p in parts if p.event == "debug"] == ["checkpoint", "task", "task_result", "checkpoint"]
    values = [p.data for p in parts if p.event == "values"]
    assert values[-1]["messages"][-1]["content"] == story(4)
    assert [p.data["event"] for p in parts if p.event == "events"][-1] == "on_chain_end"


def test_child_turns_stream_events_under_their_namespace_with_their_parents(client: Client) -> None:
    parts = _stream(client, "desk", "delegate sum it up", ["events"], stream_subgraphs=True)
    run_id = parts[0].data["run_id"]
    child = [p for p in parts if p.event.startswith("events|")]
    assert child, [p.event for p in parts]
    namespace = child[0].event.split("|", 1)[1]
    child_turn = namespace.split(":", 1)[1]
    starts = [p.data for p in child if p.data["event"] == "on_chain_start"]
    assert len(starts) == 1 and starts[0]["run_id"] == child_turn and starts[0]["parent_ids"][0] == run_id
    inner = [p.data for p in child if p.data["event"] == "on_chat_model_end"]
    assert inner and all(e["parent_ids"][0] == run_id and e["parent_ids"][-1] == child_turn for e in inner)


def test_a_run_waiting_for_a_person_ends_on_a_debug_checkpoint_carrying_the_interrupt(client: Client) -> None:
    parts = _stream(client, "desk", "ticket for the db", ["debug", "updates"])
    (interrupt,) = next(p.data["__interrupt__"] for p in parts if p.event == "updates" and "__interrupt__" in p.data)
    last = [p.data for p in parts if p.event == "debug"][-1]
    assert last["type"] == "checkpoint" and last["payload"]["next"] == ["tools"]
    assert last["payload"]["tasks"][0]["interrupts"] == [interrupt] and parts[-1].event == "end"
