"""Scheduled turns under `celery beat`: one turn per tick, even with two beat processes running by mistake."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_runner import AgentTurn, AgentTurnStatus, VersionConflictError
from agent_runner.persistence import ConversationKey
from tests.helpers.celery_fleet import WorkerProcess
from tests.integration.celery_workers.celery_cluster import Cluster
from workers.celery_app.beat import run_schedule
from workers.schedules import Schedule, ScheduleOutcome

pytestmark = pytest.mark.integration

INTERVAL_S = 2
SCHEDULE_NAME = "every-two-seconds"


def _schedules_file(tmp_path: Path) -> Path:
    path = tmp_path / "schedules.json"
    spec = json.dumps({"kind": "plain", "label": "scheduled"})
    path.write_text(
        json.dumps([{"name": SCHEDULE_NAME, "agent_id": "worker-agent", "input": spec, "every": INTERVAL_S}])
    )
    return path


def _sent_ticks(beat: WorkerProcess) -> int:
    return len(re.findall(rf"Sending due task agent-runner-schedule:{SCHEDULE_NAME}\b", beat.output()))


def _scheduled_turns(cluster: Cluster) -> list[AgentTurn]:
    turns = cluster.turn_store.list_turns(limit=1000)
    return [t for t in turns if t.metadata.get("schedule") == SCHEDULE_NAME]


def _run_two_beats(make_cluster: Callable[..., Cluster], tmp_path: Path, seconds: float) -> None:
    # Given a schedule every 2 s, a worker, and two beat processes (each with its own state file)
    cluster = make_cluster(AGENT_RUNNER_SCHEDULES=str(_schedules_file(tmp_path)))
    schedule = Schedule.from_dict(json.loads(_schedules_file(tmp_path).read_text())[0])
    cluster.start_worker("w1", concurrency=2)
    beats = [cluster.start_beat("beat-a"), cluster.start_beat("beat-b")]
    cluster.wait_for(lambda: all(_sent_ticks(beat) >= 1 for beat in beats), 30, "both beats to send a tick")

    # When both run for a while
    time.sleep(seconds)
    for beat in beats:
        beat.stop()
    sent = [_sent_ticks(beat) for beat in beats]
    cluster.wait_for(lambda: cluster.queue_length() == 0, 30, "the queue to drain")
    cluster.wait_for(lambda: all(t.is_terminal for t in _scheduled_turns(cluster)), 30, "the scheduled turns to finish")

    # Then every tick between the first and the last started exactly one turn, named by its tick
    turns = _scheduled_turns(cluster)
    ticks = sorted(datetime.fromisoformat(t.metadata["scheduled_for"]) for t in turns)
    assert len(ticks) == len(set(ticks)), f"a tick started several turns: {ticks}"
    expected = [ticks[0] + timedelta(seconds=INTERVAL_S * i) for i in range(len(ticks))]
    assert ticks == expected, f"ticks are missing: {ticks}"
    assert len(ticks) >= seconds / INTERVAL_S
    for turn in turns:
        assert turn.id == schedule.turn_id(datetime.fromisoformat(turn.metadata["scheduled_for"]))
        assert turn.status is AgentTurnStatus.COMPLETED and turn.final_output == "done:scheduled"
    # And both beats did send the ticks: the workers found the second of each pair a duplicate
    assert all(count >= len(ticks) // 2 for count in sent), (sent, len(ticks))
    assert sum(sent) > len(ticks)
    outcomes = "\n".join(p.output() for p in cluster.processes if p.name == "w1")
    assert "'duplicate'" in outcomes or ": duplicate" in outcomes, outcomes[-3000:]


def test_two_beats_start_one_turn_per_tick(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    _run_two_beats(make_cluster, tmp_path, seconds=7)


@pytest.mark.slow
def test_two_beats_start_one_turn_per_tick_for_twenty_seconds(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    _run_two_beats(make_cluster, tmp_path, seconds=20)


def test_a_repeated_tick_of_a_conversation_schedule_keeps_the_redis_mark_of_its_turn(cluster: Cluster) -> None:
    # Given a conversation schedule whose tick started a turn (marked active in the Redis guard)
    schedule = Schedule(
        "conversation-tick",
        "worker-agent",
        json.dumps({"kind": "plain", "label": "c"}),
        every=60,
        conversation_id="conv-scheduled",
    )
    tick = schedule.latest_tick(datetime.now(UTC))
    assert run_schedule(cluster.wiring, schedule, tick) is ScheduleOutcome.STARTED
    turn_id = schedule.turn_id(tick)
    assert cluster.wiring.guard.holder(ConversationKey("conv-scheduled")) == turn_id

    # When the same tick arrives again (a second beat), racing past the existence check
    with pytest.raises(VersionConflictError):
        cluster.runner.start("worker-agent", "again", conversation_id="conv-scheduled", turn_id=turn_id)
    assert run_schedule(cluster.wiring, schedule, tick) is ScheduleOutcome.DUPLICATE

    # Then the conversation is still marked for the tick's turn, and only that turn exists
    assert cluster.wiring.guard.holder(ConversationKey("conv-scheduled")) == turn_id
    assert [t.id for t in cluster.turn_store.list_turns(conversation_id="conv-scheduled")] == [turn_id]
