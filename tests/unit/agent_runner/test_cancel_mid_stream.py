"""A cancel that arrives while the model streams its answer: the stream is abandoned and the turn ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

import pytest

from agent_runner import (
    Agent,
    AgentEventType,
    AgentRunner,
    AgentTurnStatus,
    AiMessage,
    ChatRequest,
    ChatResponse,
    InMemoryAgentTurnStore,
)
from agent_runner._runtime.cancel_watch import CancelWatch
from agent_runner.persistence import CancelFlagSource, EventScope, TurnRef
from tests.unit.agent_runner.turn_kit import EventLog


class StreamingModel:
    """Streams `chunks` deltas, `pause` seconds apart, and counts how many it sent."""

    def __init__(self, chunks: int = 200, pause: float = 0.005) -> None:
        self.chunks = chunks
        self.pause = pause
        self.sent = 0
        self.started = threading.Event()

    def generate(self, request: ChatRequest) -> ChatResponse:
        self.started.set()
        for index in range(self.chunks):
            time.sleep(self.pause)
            if request.on_delta is not None:
                request.on_delta(f"w{index} ")
            self.sent += 1
        return ChatResponse(message=AiMessage(content="".join(f"w{i} " for i in range(self.chunks))))


def test_a_cancel_mid_stream_abandons_the_stream_and_ends_the_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CancelWatch, "INTERVAL_S", 0.01)
    store = InMemoryAgentTurnStore()
    runner = AgentRunner(turn_store=store)
    events = EventLog()
    runner.add_event_listener(events)
    model = StreamingModel()
    turn = runner.start(Agent(id="talker", chat_model=model), "tell me a long story")

    stepping = threading.Thread(target=runner.run_until_blocked, args=(turn,))
    stepping.start()
    assert model.started.wait(5)
    time.sleep(0.05)
    cancelled = runner.cancel(turn.id, reason="the listener left")
    assert cancelled.status is AgentTurnStatus.RUNNING and cancelled.cancel_requested  # flagged, not ended
    stepping.join(10)

    ended = store.load(turn.id)
    assert (ended.status, ended.error) == (AgentTurnStatus.CANCELLED, "the listener left")
    assert model.sent < model.chunks  # the rest of the answer was never paid for
    types = events.types(turn.id)
    assert types[-1] is AgentEventType.TURN_CANCELLED  # nothing of the turn follows its end
    assert AgentEventType.MODEL_RESPONSE not in types
    durable = [e.type for e in store.read_events(EventScope.tree(turn.id))]
    assert durable[-1] is AgentEventType.TURN_CANCELLED


def test_without_a_cancel_the_stream_runs_to_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CancelWatch, "INTERVAL_S", 0.0)
    runner = AgentRunner()
    model = StreamingModel(chunks=20, pause=0)
    turn = runner.run(Agent(id="talker", chat_model=model), "hi")
    assert turn.status is AgentTurnStatus.COMPLETED and model.sent == 20


class CountingStore(InMemoryAgentTurnStore):
    """Records each batched read of cancel flags: the ids it was asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[set[str]] = []

    def cancel_requested_among(self, turn_ids: Collection[str]) -> set[str]:
        self.reads.append(set(turn_ids))
        return super().cancel_requested_among(turn_ids)


class StoreWithoutBatchedFlags(InMemoryAgentTurnStore):
    """A store that is not a `CancelFlagSource` (as a third-party store may be): read turn by turn."""

    cancel_requested_among = None  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.refs_read = 0

    def get_ref(self, turn_id: str) -> TurnRef:
        self.refs_read += 1
        return super().get_ref(turn_id)


def stream_together(runner: AgentRunner, turns: int, cancel_index: int) -> list[AgentTurnStatus]:
    """Run `turns` streaming turns at once (each model waits until all are streaming); cancel one of them."""
    together = threading.Barrier(turns, timeout=10)

    class TogetherModel(StreamingModel):
        def generate(self, request: ChatRequest) -> ChatResponse:
            if request.on_delta is not None:
                request.on_delta("first ")
            together.wait()
            return super().generate(request)

    models = [TogetherModel(chunks=60, pause=0.005) for _ in range(turns)]
    started = [runner.start(Agent(id=f"talker-{i}", chat_model=model), "a story") for i, model in enumerate(models)]
    threads = [threading.Thread(target=runner.run_until_blocked, args=(turn,)) for turn in started]
    for thread in threads:
        thread.start()
    assert all(model.started.wait(5) for model in models)
    runner.cancel(started[cancel_index].id, reason="left")
    for thread in threads:
        thread.join(20)
    assert models[cancel_index].sent < models[cancel_index].chunks
    return [runner.turn_store.load(turn.id).status for turn in started]


def test_one_read_of_the_cancel_flags_serves_every_streaming_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CancelWatch, "INTERVAL_S", 0.02)
    store = CountingStore()
    runner = AgentRunner(turn_store=store)
    began = time.monotonic()
    statuses = stream_together(runner, turns=6, cancel_index=2)
    elapsed = time.monotonic() - began

    assert statuses[2] is AgentTurnStatus.CANCELLED
    assert statuses[:2] + statuses[3:] == [AgentTurnStatus.COMPLETED] * 5
    # One read per interval for the whole process, each about every turn then streaming (not
    # one per turn per interval, as six separate watches would make).
    assert 1 <= len(store.reads) <= elapsed / 0.02 + 1
    assert max(len(ids) for ids in store.reads) == 6


def test_a_store_without_batched_flags_is_read_turn_by_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CancelWatch, "INTERVAL_S", 0.02)
    store = StoreWithoutBatchedFlags()
    as_seen_by_the_runner: object = store
    assert not isinstance(as_seen_by_the_runner, CancelFlagSource)
    runner = AgentRunner(turn_store=store)
    statuses = stream_together(runner, turns=3, cancel_index=0)
    assert statuses == [AgentTurnStatus.CANCELLED, AgentTurnStatus.COMPLETED, AgentTurnStatus.COMPLETED]
    assert store.refs_read > 0
