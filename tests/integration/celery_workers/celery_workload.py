"""A mixed workload of turns for the Celery worker tests: scenarios, the people who answer them, the checks."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent_runner import AgentTurnStatus
from tests.integration.celery_workers.celery_cluster import Cluster

COMPLETED = AgentTurnStatus.COMPLETED


@dataclass(frozen=True)
class Scenario:
    """One turn to start: its user message, the status it must end in, and the side effects it must make once."""

    spec: dict[str, object]
    expected: AgentTurnStatus
    effects: tuple[str, ...]


def scenario(index: int, *, slow: bool = False) -> Scenario:
    """The `index`-th scenario of a mixed workload (every kind comes round in turn)."""
    label = f"t{index}"
    kinds: list[Callable[[], Scenario]] = [
        lambda: Scenario({"kind": "plain", "label": label}, COMPLETED, ()),
        lambda: Scenario(
            {"kind": "steps", "label": label, "steps": 3}, COMPLETED, tuple(f"{label}:w{i}" for i in range(3))
        ),
        lambda: Scenario({"kind": "approval", "label": label}, COMPLETED, (f"{label}:approved",)),
        lambda: Scenario({"kind": "form", "label": label}, COMPLETED, (f"{label}:filled",)),
        lambda: Scenario({"kind": "retry", "label": label, "failures": 2}, COMPLETED, (f"{label}:flaky",)),
        lambda: Scenario(
            {"kind": "fanout", "label": label, "children": 3}, COMPLETED, tuple(f"{label}.c{i}:w0" for i in range(3))
        ),
        # Fails more often than the retry policy allows (4 attempts): the turn FAILS, no effect.
        lambda: Scenario({"kind": "retry", "label": label, "failures": 9}, AgentTurnStatus.FAILED, ()),
    ]
    if slow:
        kinds.append(
            lambda: Scenario(
                {"kind": "slow", "label": label, "seconds": 0.3}, COMPLETED, tuple(f"{label}:s{i}" for i in range(3))
            )
        )
    return kinds[index % len(kinds)]()


def run_workload(
    cluster: Cluster,
    scenarios: list[Scenario],
    timeout: float,
    during: Callable[[], None] = lambda: None,
    other_effects: tuple[str, ...] = (),
    others_done: Callable[[], bool] = lambda: True,
) -> None:
    """Start every scenario, play the people until all turns ended, then check statuses and the ledger.

    `other_effects` are side effects of work started elsewhere (inbox messages), which is
    over when `others_done` says so.
    """
    started = {cluster.runner.start("worker-agent", json.dumps(s.spec)).id: s for s in scenarios}
    pending = list(started)

    def all_ended() -> bool:
        nonlocal pending
        pending = [turn_id for turn_id in pending if not cluster.load(turn_id).is_terminal]
        return not pending and others_done()

    def tick() -> None:
        cluster.answer_people(pending)
        during()

    cluster.wait_for(all_ended, timeout, f"{len(started)} turns to end", tick=tick)

    statuses = {turn_id: cluster.load(turn_id).status for turn_id in started}
    wrong = {
        turn_id: (status, started[turn_id].spec)
        for turn_id, status in statuses.items()
        if status is not started[turn_id].expected
    }
    assert wrong == {}, f"turns that ended in the wrong status: {wrong}"
    check_ledger(cluster, [effect for s in scenarios for effect in s.effects] + list(other_effects))


def check_ledger(cluster: Cluster, expected_effects: list[str], optional_effects: Iterable[str] = ()) -> None:
    """Every expected side effect happened, and none happened twice (one idempotency key each).

    `optional_effects` may or may not have happened (those of turns cancelled midway).
    """
    rows = cluster.ledger()
    per_effect = Counter(row["effect"] for row in rows)
    assert {effect: n for effect, n in per_effect.items() if n > 1} == {}, "an effect ran under two idempotency keys"
    missing = sorted(set(expected_effects) - set(per_effect))
    unexpected = sorted(set(per_effect) - set(expected_effects) - set(optional_effects))
    assert not missing and not unexpected, f"missing effects {missing}, unexpected effects {unexpected}"


def in_flight(log: str) -> set[str]:
    """Ids of the tasks a worker log shows received but not finished."""
    received = set(re.findall(r"Task agent_runner\.\w+\[([0-9a-f-]+)\] received", log))
    finished = set(re.findall(r"Task agent_runner\.\w+\[([0-9a-f-]+)\] (?:succeeded|raised|retry)", log))
    return received - finished
