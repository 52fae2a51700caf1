"""A cancel that arrives while the model streams its answer: the stream is abandoned and the turn ends."""

from __future__ import annotations

import threading
import time

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
from agent_runner._runtime.streaming import DeltaSink
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
    monkeypatch.setattr(DeltaSink, "CANCEL_CHECK_S", 0.01)
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
    durable = [e.type for e in store.read_events(root_turn_id=turn.id)]
    assert durable[-1] is AgentEventType.TURN_CANCELLED


def test_without_a_cancel_the_stream_runs_to_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DeltaSink, "CANCEL_CHECK_S", 0.0)
    runner = AgentRunner()
    model = StreamingModel(chunks=20, pause=0)
    turn = runner.run(Agent(id="talker", chat_model=model), "hi")
    assert turn.status is AgentTurnStatus.COMPLETED and model.sent == 20
