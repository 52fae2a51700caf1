"""The embedded `AgentWorker` and the Celery workers save the same history for the same scenario.

Every test runs once per execution path (`deployment`: embedded worker processes on
PostgreSQL with the SQL lease, or Celery worker processes on PostgreSQL and Redis; see
`parity_deployments`) and compares what the run saved with one expected `SavedHistory`,
shared by both paths: the turn tree's final statuses, the model-visible messages, the page
actions and who decided them, the conversation's ChatMemory timeline, the durable events of
each turn read back with `read_events(EventScope.tree(...))` (each exactly once), and the side
effects the tools made. The workers are stopped before the history is read, so nothing can
change it afterwards.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from agent_runner import AgentResumeCommand, AgentTurn, AgentTurnStatus, UserMessage
from tests.helpers.jsonl import read_jsonl
from tests.helpers.processes import frozen
from tests.integration.parity.parity_agents import AGENT_ID
from tests.integration.parity.parity_deployments import Deployment
from tests.integration.parity.parity_history import SavedHistory

pytestmark = pytest.mark.integration


def _start(deployment: Deployment, kind: str) -> AgentTurn:
    """Start the scenario `kind` in a conversation of its own; the workers run it."""
    question = UserMessage(id=f"{kind}-question", content=json.dumps({"kind": kind, "label": kind}))
    return deployment.runner.start(AGENT_ID, question, conversation_id=f"conversation-{kind}")


def _waiting_for_approval_of(deployment: Deployment, turn_id: str, call_id: str) -> AgentTurn:
    return deployment.wait_for_turn(
        turn_id,
        lambda t: (
            t.status is AgentTurnStatus.WAITING_FOR_APPROVAL
            and t.suspension is not None
            and t.suspension.correlation_id == call_id
        ),
        f"the approval of {call_id}",
    )


def _ended(deployment: Deployment, turn_id: str) -> AgentTurn:
    return deployment.wait_for_turn(turn_id, lambda t: t.is_terminal, "the turn to end")


def _executions(deployment: Deployment, key: str) -> list[dict[str, Any]]:
    """The executions of the tool call with idempotency key `key`, in the order they started."""
    return [record for record in read_jsonl(deployment.signals.executions) if record["key"] == key]


APPROVAL = SavedHistory(
    turns={"T": "parity-agent COMPLETED v9 steps=6"},
    messages={
        "T": [
            'approval-question user: {"kind": "approval", "label": "approval"}',
            'T-1 assistant calls approval-0-0 approved_write({"effect": "approval:first"})',
            "T-2 tool approval-0-0 approved_write: wrote approval:first",
            'T-3 assistant calls approval-1-0 approved_write({"effect": "approval:second"})',
            "T-4 tool approval-1-0 approved_write (error): The user rejected this tool call: not twice",
            "T-5 assistant: done:approval",
        ]
    },
    page_actions={
        "T": [
            "T-action-approval-0-0 approval approval-0-0 APPROVED by u-1",
            "T-action-approval-1-0 approval approval-1-0 REJECTED by u-2: not twice",
        ]
    },
    timeline=[
        'approval-question user: {"kind": "approval", "label": "approval"}',
        'T-1 assistant calls approval-0-0 approved_write({"effect": "approval:first"})',
        "T-action-approval-0-0 approval approval-0-0 approved_write v1 APPROVED by u-1",
        "T-2 tool approval-0-0 approved_write: wrote approval:first",
        'T-3 assistant calls approval-1-0 approved_write({"effect": "approval:second"})',
        "T-action-approval-1-0 approval approval-1-0 approved_write v1 REJECTED by u-2: not twice",
        "T-4 tool approval-1-0 approved_write (error): The user rejected this tool call: not twice",
        "T-5 assistant: done:approval",
    ],
    events={
        "T": [
            "v0 TURN_STARTED",
            "v1 TURN_RUNNING",
            "v2 MODEL_RESPONSE",
            "v3 TURN_SUSPENDED",
            "v4 TURN_RESUMED",
            "v5 TOOL_STARTED",
            "v5 TOOL_COMPLETED",
            "v6 MODEL_RESPONSE",
            "v7 TURN_SUSPENDED",
            "v8 TURN_RESUMED",
            "v9 MODEL_RESPONSE",
            "v9 TURN_COMPLETED",
        ]
    },
    effects=["approval:first: made by attempts [1] under 1 idempotency key(s)"],
    problems=[],
)


def test_an_approved_then_a_rejected_call(deployment: Deployment) -> None:
    # Given a worker, and a turn whose model asks twice for a call that needs approval
    deployment.start_workers("w1")
    turn = _start(deployment, "approval")

    # When u-1 approves the first call, and u-2 rejects the second with a reason
    _waiting_for_approval_of(deployment, turn.id, "approval-0-0")
    approve = AgentResumeCommand.approve_tool("approval-0-0").with_metadata("approverId", "u-1")
    deployment.runner.submit_resume(turn.id, approve)
    _waiting_for_approval_of(deployment, turn.id, "approval-1-0")
    reject = AgentResumeCommand.reject_tool("approval-1-0", reason="not twice").with_metadata("approverId", "u-2")
    deployment.runner.submit_resume(turn.id, reject)
    _ended(deployment, turn.id)
    deployment.stop_workers()

    # Then only the approved call ran, the model read the rejection, and the approval cards
    # show each decision and who made it
    assert deployment.history(turn.id) == APPROVAL


RETRY = SavedHistory(
    turns={"T": "parity-agent COMPLETED v5 steps=4"},
    messages={
        "T": [
            'retry-question user: {"kind": "retry", "label": "retry"}',
            'T-1 assistant calls retry-0-0 flaky_write({"effect": "retry:flaky", "failures": 1})',
            "T-2 tool retry-0-0 flaky_write: wrote retry:flaky on attempt 2",
            "T-3 assistant: done:retry",
        ]
    },
    page_actions={},
    timeline=[
        'retry-question user: {"kind": "retry", "label": "retry"}',
        'T-1 assistant calls retry-0-0 flaky_write({"effect": "retry:flaky", "failures": 1})',
        "T-2 tool retry-0-0 flaky_write: wrote retry:flaky on attempt 2",
        "T-3 assistant: done:retry",
    ],
    events={
        "T": [
            "v0 TURN_STARTED",
            "v1 TURN_RUNNING",
            "v2 MODEL_RESPONSE",
            # the failed attempt's TOOL_STARTED is saved with the retry it led to
            "v3 TOOL_STARTED",
            "v3 RETRY_SCHEDULED",
            "v4 TURN_RESUMED",
            "v4 TOOL_STARTED",
            "v4 TOOL_COMPLETED",
            "v5 MODEL_RESPONSE",
            "v5 TURN_COMPLETED",
        ]
    },
    effects=["retry:flaky: made by attempts [2] under 1 idempotency key(s)"],
    problems=[],
)


def test_a_recoverable_tool_error_and_the_retry_that_succeeds(deployment: Deployment) -> None:
    # Given a worker, and a turn whose tool fails recoverably on its first attempt
    deployment.start_workers("w1")
    turn = _start(deployment, "retry")

    # When the retry comes due and the workers run it
    _ended(deployment, turn.id)
    deployment.stop_workers()

    # Then the call was tried again under the same idempotency key, with one result and one effect
    assert deployment.history(turn.id) == RETRY


def _delegation(label: str) -> str:
    """A delegation call's name and arguments, for the sub-agent that plays the rendezvous `label`."""
    task = json.dumps({"task": json.dumps({"kind": "meet", "label": label, "barrier": "fanout", "parties": 2})})
    return f"{label.rsplit('.', 1)[1]}({task})"


def _child(name: str, label: str) -> list[str]:
    """The messages of the child turn `name` that plays the rendezvous `label`."""
    task = json.dumps({"kind": "meet", "label": label, "barrier": "fanout", "parties": 2})
    return [
        f"{name}-0 user: {task}",
        f'{name}-1 assistant calls {label}-0-0 rendezvous({{"barrier": "fanout", "parties": 2}})',
        f"{name}-2 tool {label}-0-0 rendezvous: 2 calls met at fanout",
        f"{name}-3 assistant: done:{label}",
    ]


CHILD_EVENTS = [
    "v0 TURN_STARTED",
    "v1 TURN_RUNNING",
    "v2 MODEL_RESPONSE",
    "v3 TOOL_STARTED",
    "v3 TOOL_COMPLETED",
    "v4 MODEL_RESPONSE",
    "v4 TURN_COMPLETED",
]
FAN_OUT = SavedHistory(
    turns={
        "T": "parity-agent COMPLETED v8 steps=5",
        "T.1": "scout COMPLETED v4 steps=3",
        "T.2": "scribe COMPLETED v4 steps=3",
    },
    messages={
        "T": [
            'fanout-question user: {"kind": "fanout", "label": "fanout"}',
            f"T-1 assistant calls fanout-0-0 {_delegation('fanout.scout')}; fanout-0-1 {_delegation('fanout.scribe')}",
            "T-2 tool fanout-0-0 scout: done:fanout.scout",
            "T-3 tool fanout-0-1 scribe: done:fanout.scribe",
            "T-4 assistant: done:fanout",
        ],
        "T.1": _child("T.1", "fanout.scout"),
        "T.2": _child("T.2", "fanout.scribe"),
    },
    page_actions={},
    timeline=[
        'fanout-question user: {"kind": "fanout", "label": "fanout"}',
        f"T-1 assistant calls fanout-0-0 {_delegation('fanout.scout')}; fanout-0-1 {_delegation('fanout.scribe')}",
        "T-2 tool fanout-0-0 scout: done:fanout.scout",
        "T-3 tool fanout-0-1 scribe: done:fanout.scribe",
        "T-4 assistant: done:fanout",
    ],
    events={
        "T": [
            "v0 TURN_STARTED",
            "v1 TURN_RUNNING",
            "v2 MODEL_RESPONSE",
            "v3 TURN_SUSPENDED",
            # v4 recorded the first child to end (the parent still waits: no event); the save
            # that recorded the second resumed the parent, once
            "v5 TURN_RESUMED",
            "v6 TOOL_COMPLETED",
            "v7 TOOL_COMPLETED",
            "v8 MODEL_RESPONSE",
            "v8 TURN_COMPLETED",
        ],
        "T.1": CHILD_EVENTS,
        "T.2": CHILD_EVENTS,
    },
    effects=[],
    problems=[],
)


def test_two_sub_agents_run_in_parallel_and_the_last_resumes_the_parent_once(deployment: Deployment) -> None:
    # Given a worker with two stepping threads (pool processes), and a turn whose model
    # delegates to two sub-agents in one response; each child's tool waits for the other's
    # (a rendezvous), so they complete only when they run at the same time
    deployment.start_workers("w1")
    turn = _start(deployment, "fanout")

    # When the workers run the tree
    _ended(deployment, turn.id)
    deployment.stop_workers()

    # Then both children met, each child's answer is the result of its delegation call, and
    # the parent was resumed once
    assert deployment.history(turn.id) == FAN_OUT


CANCEL = SavedHistory(
    turns={"T": "parity-agent CANCELLED v4 steps=2 error='the customer hung up'"},
    messages={
        "T": [
            'cancel-question user: {"kind": "cancel", "label": "cancel"}',
            "T-1 assistant calls "
            'cancel-0-0 held_write({"effect": "cancel:held", "gate": "cancel"}); cancel-0-1 write({"effect": "cancel:next"})',
            "T-2 tool cancel-0-0 held_write: wrote cancel:held on attempt 1",
            "T-3 tool cancel-0-1 write (error): Tool call write was not completed: the customer hung up",
            "T-4 assistant: This turn ended before it was finished: the customer hung up",
        ]
    },
    page_actions={},
    timeline=[
        'cancel-question user: {"kind": "cancel", "label": "cancel"}',
        "T-1 assistant calls "
        'cancel-0-0 held_write({"effect": "cancel:held", "gate": "cancel"}); cancel-0-1 write({"effect": "cancel:next"})',
        "T-2 tool cancel-0-0 held_write: wrote cancel:held on attempt 1",
        "T-3 tool cancel-0-1 write (error): Tool call write was not completed: the customer hung up",
        "T-4 assistant: This turn ended before it was finished: the customer hung up",
    ],
    events={
        "T": [
            "v0 TURN_STARTED",
            "v1 TURN_RUNNING",
            "v2 MODEL_RESPONSE",
            "v3 TOOL_STARTED",
            "v3 TOOL_COMPLETED",
            "v4 TURN_CANCELLED",
        ]
    },
    effects=["cancel:held: made by attempts [1] under 1 idempotency key(s)"],
    problems=[],
)


def test_a_turn_cancelled_while_its_tool_runs_ends_cancelled_at_the_next_boundary(deployment: Deployment) -> None:
    # Given a worker running the first of two tool calls, held until the test lets it go
    deployment.start_workers("w1")
    turn = _start(deployment, "cancel")
    deployment.wait_for(lambda: _executions(deployment, f"{turn.id}:cancel-0-0"), 30, "the held tool to start")

    # When the RUNNING turn is cancelled, and then the tool returns
    flagged = deployment.runner.cancel(turn.id, reason="the customer hung up")
    assert (flagged.status, flagged.cancel_requested) == (AgentTurnStatus.RUNNING, True)
    deployment.signals.open_gate("cancel")
    ended = _ended(deployment, turn.id)
    deployment.stop_workers()

    # Then the finished call's result is kept, the other call and the turn are closed out
    # with the caller's reason, the turn is CANCELLED, and nothing was saved after the terminal event
    assert deployment.load(turn.id) == ended
    assert deployment.history(turn.id) == CANCEL


TAKEOVER = SavedHistory(
    turns={"T": "parity-agent COMPLETED v4 steps=3"},
    messages={
        "T": [
            'takeover-question user: {"kind": "takeover", "label": "takeover"}',
            'T-1 assistant calls takeover-0-0 held_write({"effect": "takeover:held", "gate": "takeover"})',
            # one result, the taker's: the frozen worker's late one was refused
            "T-2 tool takeover-0-0 held_write: wrote takeover:held on attempt 2",
            "T-3 assistant: done:takeover",
        ]
    },
    page_actions={},
    timeline=[
        'takeover-question user: {"kind": "takeover", "label": "takeover"}',
        'T-1 assistant calls takeover-0-0 held_write({"effect": "takeover:held", "gate": "takeover"})',
        "T-2 tool takeover-0-0 held_write: wrote takeover:held on attempt 2",
        "T-3 assistant: done:takeover",
    ],
    events={
        "T": [
            "v0 TURN_STARTED",
            "v1 TURN_RUNNING",
            "v2 MODEL_RESPONSE",
            "v3 TOOL_STARTED",
            "v3 TOOL_COMPLETED",
            "v4 MODEL_RESPONSE",
            "v4 TURN_COMPLETED",
        ]
    },
    # The call ran twice, the taker's attempt first and the frozen worker's late one after,
    # under one idempotency key: a ledger that dedupes on it applied the effect once.
    effects=["takeover:held: made by attempts [2, 1] under 1 idempotency key(s)"],
    problems=[],
)


def test_a_worker_frozen_past_its_lease_is_taken_over_and_its_late_save_refused(deployment: Deployment) -> None:
    # Given two workers, one of them inside a tool call that holds until the test lets it go
    deployment.start_workers("w1", "w2")
    turn = _start(deployment, "takeover")
    key = f"{turn.id}:takeover-0-0"
    [first] = deployment.wait_for(lambda: _executions(deployment, key), 30, "the held tool to start")
    holder = os.getpgid(first["pid"])  # the worker process (group) that runs the tool

    # When that worker freezes (SIGSTOP: its lease heartbeat stops too) until the other one
    # has taken the turn over after the lease TTL, re-run the call and finished the turn
    with frozen(holder):
        deployment.hand_over_stale_turn()
        done = _ended(deployment, turn.id)

    # And it then wakes up, its tool returns, and it tries to save the result
    deployment.signals.open_gate("takeover")
    refused = deployment.wait_for(
        lambda: [r for r in read_jsonl(deployment.signals.steps) if r["turn"] == turn.id and r["outcome"] != "saved"],
        30,
        "the frozen worker's late save",
    )
    deployment.stop_workers()

    # Then its save was refused (the store moved on under a newer lease), nothing changed
    # after the turn ended, and the history shows one result for the call
    assert [(r["pid"], r["version"], r["outcome"]) for r in refused] == [(first["pid"], 2, "conflict")]
    assert [(e["attempt"], e["pid"] == first["pid"]) for e in _executions(deployment, key)] == [(1, True), (2, False)]
    assert deployment.load(turn.id) == done
    assert deployment.history(turn.id) == TAKEOVER
