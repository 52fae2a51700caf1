"""Forged Celery messages: the task entry points, called as Celery calls them, reject bad arguments with one warning."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from agent_runner.persistence import ConversationKey
from tests.helpers.hostile import SQL_INJECTION

FORGED: list[Any] = [
    pytest.param("step", (), {}, id="step-no-arguments"),
    pytest.param("step", ("t",), {}, id="step-one-argument"),
    pytest.param("step", ("t", 1, 2), {}, id="step-three-arguments"),
    pytest.param("step", ("t", "1"), {}, id="step-version-str"),
    pytest.param("step", ("t", None), {}, id="step-version-none"),
    pytest.param("step", ("t", True), {}, id="step-version-bool"),
    pytest.param("step", ("t", 1.5), {}, id="step-version-float"),
    pytest.param("step", (1, 1), {}, id="step-id-int"),
    pytest.param("step", (["t"], 1), {}, id="step-id-list"),
    pytest.param("step", ({"t": 1}, 1), {}, id="step-id-dict"),
    pytest.param("step", ("", 1), {}, id="step-id-empty"),
    pytest.param("step", ("t" * 1_000_000, 1), {}, id="step-id-1MB"),
    pytest.param("step", ("t\x00", 1), {}, id="step-id-nul"),
    pytest.param("step", (SQL_INJECTION, 1), {}, id="step-id-sql"),
    pytest.param("step", ("t",), {"version": 1, "extra": 2}, id="step-unknown-keyword"),
    pytest.param("step", ("t", 1), {"turn_id": "t"}, id="step-twice"),
    pytest.param("inbox", (), {}, id="inbox-no-arguments"),
    pytest.param("inbox", (None,), {}, id="inbox-none"),
    pytest.param("inbox", ("c", "d", "e"), {}, id="inbox-three"),
    pytest.param("inbox", ("c\ud800",), {}, id="inbox-surrogate"),
    pytest.param("inbox", ("t/c",), {}, id="inbox-tenant-inside-the-id"),
    pytest.param("inbox", ("c", "t.1"), {}, id="inbox-tenant-outside-the-tenant-rules"),
    pytest.param("inbox", ("c", ""), {}, id="inbox-empty-tenant"),
    pytest.param("inbox", ("c", 1), {}, id="inbox-tenant-not-text"),
    pytest.param("sweep_inbox", (1,), {}, id="sweep-inbox-argument"),
    pytest.param("sweep_stale_turns", (), {"x": 1}, id="sweep-stale-keyword"),
    pytest.param("sweep_due_retries", ("now",), {}, id="sweep-retries-argument"),
]


def test_a_tenants_conversation_id_passes_the_inbox_tasks_argument_check(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.celery_app import tasks
    from workers.inbox import InboxOutcome

    # Given a worker whose inbox dispatch is observed (no wiring is built)
    served: list[ConversationKey] = []

    def serve(_wiring: object, conversation: ConversationKey) -> InboxOutcome:
        served.append(conversation)
        return InboxOutcome.EMPTY

    monkeypatch.setattr(tasks, "current", lambda: None)
    monkeypatch.setattr(tasks, "start_next_message", serve)
    # When dispatch requests arrive for a tenant's conversation and for one without a tenant
    with caplog.at_level(logging.WARNING):
        outcomes = [tasks._dispatch_inbox("c-1", "tenant-a"), tasks._dispatch_inbox(conversation_id="c-1")]
    # Then both reach the dispatch, each with its tenant, nothing is rejected and nothing is logged
    assert outcomes == ["empty", "empty"] and served == [ConversationKey("c-1", "tenant-a"), ConversationKey("c-1")]
    assert caplog.records == []


@pytest.mark.parametrize(("task", "args", "kwargs"), FORGED)
def test_forged_task_arguments_are_rejected_with_one_warning(
    caplog: pytest.LogCaptureFixture, task: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    from workers.celery_app import beat, tasks

    entries: dict[str, Callable[..., Any]] = {
        "step": tasks._step_turn,
        "inbox": tasks._dispatch_inbox,
        "sweep_inbox": beat.SWEEP_ENTRIES["inbox"],
        "sweep_stale_turns": beat.SWEEP_ENTRIES["stale_turns"],
        "sweep_due_retries": beat.SWEEP_ENTRIES["due_retries"],
    }
    entry = entries[task]
    with caplog.at_level(logging.DEBUG):
        outcome = entry(*args, **kwargs)
    # Rejected before any wiring (database, Redis, broker) was built or touched
    assert outcome in ("rejected", 0)
    [record] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert "rejected" in record.getMessage() and "not retried" in record.getMessage()
    assert len(record.getMessage()) < 400  # the forged values themselves are not echoed
