"""Two tenants on one `agent-runner serve --worker celery`, with every feature at once, while workers and connections die.

The tenants use the same conversation ids. Each posts its messages to its conversations
one after the other, without waiting for the turns: most queue (`if_busy=enqueue`, 202),
some interrupt the active turn (`if_busy=interrupt`). The turns ask for approvals and
forms (answered through the API by the tenant's people), leave an approval to its
deadline, fan out to child turns, retry, and write side effects to a ledger keyed by the
tool idempotency key. A schedule fires every two seconds. Meanwhile worker processes are
SIGKILLed and replaced, and the PostgreSQL backends of the workers and beat are terminated
in the middle of their statements.

Then: no accepted message is lost (each started exactly one turn), a conversation's
queued messages started in the order they were accepted, no side effect happened under
two idempotency keys, each tenant sees only its own turns and conversations, and every
turn ended, in the status its scenario leads to (or cancelled by a later interrupt).
SSE streams are not read here: how they end is being reworked.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import sqlalchemy as sa

from agent_runner import AgentTurnStatus
from store.schema import NO_TENANT, inbox_messages, turns
from tests.helpers.api_server import ApiServer
from tests.helpers.celery_fleet import WorkerProcess
from tests.integration.celery_workers import ops_agents
from tests.integration.celery_workers.celery_cluster import RABBITMQ_URL, Cluster, ConnectionKiller
from tests.integration.celery_workers.celery_workload import COMPLETED, Scenario, check_ledger, scenario

pytestmark = pytest.mark.integration

LOADER = f"{ops_agents.__name__}:build_loader"
TENANTS = {"tenant-a": "key-a-5f0c2b7d9e", "tenant-b": "key-b-81a4c6e03f"}
SCHEDULE = "chaos-tick"
TERMINAL = {s.value for s in AgentTurnStatus if s.is_terminal}


@dataclass(frozen=True)
class Message:
    """One message a tenant posts: where, how, and what its turn must do."""

    tenant: str
    conversation: str
    agent_id: str
    text: str
    if_busy: str
    scenario: Scenario

    @property
    def label(self) -> str:
        return str(self.scenario.spec["label"])


@dataclass
class Accepted:
    """The messages the server accepted (201 with a turn, or 202 QUEUED), and what it refused."""

    answers: dict[str, list[Message]] = field(default_factory=lambda: defaultdict(list))
    """The accepted messages of each conversation (`tenant/conversation`), in the order accepted."""
    refused: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, message: Message, status: int, body: str) -> None:
        with self.lock:
            if status in (201, 202):
                self.answers[f"{message.tenant}/{message.conversation}"].append(message)
            else:
                self.refused.append(f"{message.label}: {status} {body[:300]}")

    def messages(self) -> list[Message]:
        return [message for answers in self.answers.values() for message in answers]


@dataclass(frozen=True)
class RunSize:
    """How much one run does: conversations per tenant, messages per conversation, worker kills, time allowed."""

    conversations: int
    per_conversation: int
    max_kills: int
    timeout: float


def _messages(tenant: int, conversation: int, size: RunSize) -> list[Message]:
    """The messages of one tenant's conversation: every scenario kind in turn, a deadline, an interrupt."""
    tenant_name = list(TENANTS)[tenant]
    made: list[Message] = []
    for index in range(size.per_conversation):
        number = (tenant * size.conversations + conversation) * size.per_conversation + index
        if index % 8 == 6:
            label = f"t{number}"
            # Left to its deadline: approved by default after `APPROVAL_TIMEOUT_S`.
            deadline = Scenario({"label": label}, COMPLETED, (label,))
            made.append(Message(tenant_name, f"c-{conversation}", "deadline-agent", label, "enqueue", deadline))
            continue
        chosen = scenario(number)
        if index % 6 == 5:
            chosen = Scenario({"kind": "plain", "label": f"t{number}"}, COMPLETED, ())
        if_busy = "interrupt" if index % 6 == 5 else "enqueue"
        text = json.dumps(chosen.spec)
        made.append(Message(tenant_name, f"c-{conversation}", "worker-agent", text, if_busy, chosen))
    return made


def _post_all(server: ApiServer, messages: list[Message], accepted: Accepted, seed: int) -> None:
    """Post one conversation's messages in order, a moment apart, without waiting for their turns."""
    pace = random.Random(seed)
    with server.client(TENANTS[messages[0].tenant]) as client:
        for message in messages:
            body = {
                "agent_id": message.agent_id,
                "input": message.text,
                "conversation_id": message.conversation,
                "if_busy": message.if_busy,
                "metadata": {"label": message.label},
            }
            response = client.post("/v1/turns", json=body)
            accepted.record(message, response.status_code, response.text)
            time.sleep(pace.uniform(0.0, 0.4))


def _answer_people(server: ApiServer) -> int:
    """Each tenant's people approve the approvals (not those left to their deadline) and fill in the forms."""
    answered = 0
    for key in TENANTS.values():
        with server.client(key) as client:
            params: dict[str, Any] = {"status": ["WAITING_FOR_APPROVAL", "WAITING_FOR_USER"], "limit": 200}
            for view in client.get("/v1/turns", params=params).json()["items"]:
                suspension = view["suspension"] or {}
                call = suspension.get("correlation_id")
                tool_call = suspension.get("tool_call") or {}
                form = suspension.get("form") or {}
                if tool_call.get("name") == "approved_write":
                    body: dict[str, Any] = {"action": "approve", "tool_call_id": call}
                elif form.get("key") == "details":
                    body = {"action": "form", "tool_call_id": call, "data": {"value": "filled"}}
                else:
                    continue
                response = client.post(f"/v1/turns/{view['id']}/resume", json=body)
                assert response.status_code in (202, 409), response.text  # 409: decided or interrupted meanwhile
                answered += response.status_code == 202
    return answered


class WorkerKiller(threading.Thread):
    """SIGKILLs a random worker process (with its pool) every few seconds, and keeps the fleet at its size.

    Like a process supervisor, it also replaces workers that exited on their own (a worker
    whose startup check lost its database connection exits).
    """

    def __init__(self, cluster: Cluster, workers: list[WorkerProcess], seed: int, max_kills: int, every: float) -> None:
        super().__init__(name="worker-killer", daemon=True)
        self._cluster = cluster
        self._workers = workers
        self._random = random.Random(seed)
        self._max_kills = max_kills
        self._every = every
        self._stopping = threading.Event()
        self.kills = 0
        self.replaced = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            next_kill = time.monotonic() + self._random.uniform(self._every, 2 * self._every)
            while not self._stopping.wait(0.5):
                for gone in [w for w in self._workers if not w.alive()]:
                    self._replace(gone)
                if self.kills < self._max_kills and time.monotonic() >= next_kill:
                    victim = self._random.choice(self._workers)
                    victim.kill()
                    self.kills += 1
                    self._replace(victim)
                    next_kill = time.monotonic() + self._random.uniform(self._every, 2 * self._every)
        except BaseException as exc:  # reported by the test: a killer that died would prove nothing
            self.error = exc

    def _replace(self, gone: WorkerProcess) -> None:
        self._workers.remove(gone)
        self.replaced += 1
        self._workers.append(self._cluster.start_worker(f"w{len(self._cluster.processes)}", wait=False))

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=30)


def _sql(url: str, query: sa.Executable) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(query))
    finally:
        engine.dispose()


def _count(table: sa.Table, *where: sa.ColumnElement[bool]) -> sa.ScalarSelect[int]:
    return sa.select(sa.func.count()).select_from(table).where(*where).scalar_subquery()


def _everything_ended(url: str) -> bool:
    """No tenant turn is still going, and no queued message waits to start."""
    [(going, waiting)] = _sql(
        url,
        sa.select(
            _count(turns, turns.c.tenant_id.is_not(None), turns.c.status.not_in(TERMINAL)),
            _count(inbox_messages, inbox_messages.c.status.in_(["PENDING", "PROCESSING"])),
        ),
    )
    return int(going) == 0 and int(waiting) == 0


def _tenant_turns(client: httpx.Client) -> list[dict[str, Any]]:
    """Every turn the tenant can list, page after page."""
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 200} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/turns", params=params).json()
        found += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return found


def run_tenants_under_chaos(
    make_cluster: Callable[..., Cluster],
    schema_url: str,
    admin: psycopg.Connection[Any],
    tmp_path: Path,
    *,
    broker_url: str | None,
    size: RunSize,
) -> None:
    """Run the tenants' messages under the faults, then check every promise (see the module docstring)."""
    # Given workers and beat whose database connections carry an application name the
    # connection killer looks for, and a server on a connection of its own
    application = f"chaos-tenants-{uuid.uuid4().hex[:10]}"
    workers_url = sa.make_url(schema_url).update_query_dict({"application_name": application})
    schedules = tmp_path / "schedules.json"
    tick = {"name": SCHEDULE, "agent_id": "worker-agent", "input": json.dumps({"kind": "plain", "label": "tick"})}
    schedules.write_text(json.dumps([{**tick, "every": 2}]))
    cluster = make_cluster(
        broker_url=broker_url,
        AGENT_RUNNER_DATABASE_URL=workers_url.render_as_string(hide_password=False),
        AGENT_RUNNER_AGENT_LOADER=LOADER,
        AGENT_RUNNER_SCHEDULES=str(schedules),
        AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S="0.5",
    )
    keys = ",".join(f"{tenant}:{key}" for tenant, key in TENANTS.items())
    server_env = {
        **cluster.env,
        "AGENT_RUNNER_DATABASE_URL": schema_url,
        "AGENT_RUNNER_API_KEYS": keys,
        "AGENT_RUNNER_API_INTERRUPT_WAIT_S": "1",
    }
    server = ApiServer(agents=LOADER, env=server_env, log=tmp_path / "server.log", args=["--worker", "celery"])
    workers = [cluster.start_worker("w0", wait=False), cluster.start_worker("w1", wait=False)]
    beat = cluster.start_beat()
    for worker in workers:
        cluster.wait_ready(worker)
    server.start()
    connection_killer = ConnectionKiller(
        admin, application, seed=size.per_conversation, pause=(0.05, 0.5), idle_first=True
    )
    worker_killer = WorkerKiller(cluster, workers, seed=size.conversations, max_kills=size.max_kills, every=2.5)
    accepted = Accepted()
    try:
        # When both tenants post to their conversations of the same ids while the faults run
        started = time.monotonic()
        connection_killer.start()
        worker_killer.start()
        posters = [
            threading.Thread(
                target=_post_all,
                args=(server, _messages(t, c, size), accepted, t * 100 + c),
                daemon=True,
            )
            for t in range(len(TENANTS))
            for c in range(size.conversations)
        ]
        for poster in posters:
            poster.start()
        answered = 0
        deadline = started + size.timeout
        finished = False
        while not finished and time.monotonic() < deadline:
            answered += _answer_people(server)
            finished = not any(p.is_alive() for p in posters) and _everything_ended(schema_url)
            time.sleep(0.3)
        elapsed = time.monotonic() - started
        connection_killer.stop()
        worker_killer.stop()
        posted = accepted.messages()
        print(
            f"{len(posted)} messages of {len(TENANTS)} tenants in {elapsed:.1f}s: {worker_killer.kills} workers "
            f"SIGKILLed ({worker_killer.replaced} replaced), {connection_killer.killed} PostgreSQL backends "
            f"terminated mid-statement, {answered} answers from people"
        )
        assert worker_killer.error is None and connection_killer.error is None, "a fault injector died"
        assert accepted.refused == [], f"messages the server did not accept: {accepted.refused}"
        assert len(posted) == len(TENANTS) * size.conversations * size.per_conversation
        if not finished:
            # Report what is missing rather than only that time ran out
            _check_turns(cluster, server, accepted, schema_url)
            pytest.fail(f"the turns had not all ended after {size.timeout}s\n{cluster.logs()[-8000:]}")
        ticks = _check_turns(cluster, server, accepted, schema_url)
        assert ticks >= 2, "the schedule did not fire during the run"
        # And the chaos was real
        assert worker_killer.kills > 0 and connection_killer.killed > 0, "no fault was injected: this proved nothing"
        logs = cluster.logs() + server.output()
        assert "rejected a" not in logs, "a worker dropped a task message"
        beat.stop()
    finally:
        connection_killer.stop()
        worker_killer.stop()
        server.stop()


def _check_turns(cluster: Cluster, server: ApiServer, accepted: Accepted, url: str) -> int:
    """Check the promises about the turns; return how many scheduled ticks ran."""
    tenant_turns: dict[str, list[dict[str, Any]]] = {}
    for tenant, key in TENANTS.items():
        with server.client(key) as client:
            tenant_turns[tenant] = _tenant_turns(client)
            # Each tenant sees only its own conversations, with the ids it knows
            for conversation in {m.conversation for m in accepted.messages() if m.tenant == tenant}:
                page = client.get(f"/v1/conversations/{conversation}/messages", params={"limit": 500}).json()
                mine = {m.text for m in accepted.messages() if (m.tenant, m.conversation) == (tenant, conversation)}
                shown = {item["content"] for item in page["items"] if item["role"] == "user"}
                assert shown <= mine, f"{tenant} sees messages of another conversation in {conversation}"
    by_id = {view["id"]: view for views in tenant_turns.values() for view in views}
    assert len(by_id) == sum(len(views) for views in tenant_turns.values()), "a turn is listed for both tenants"
    roots: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for tenant, views in tenant_turns.items():
        for view in views:
            assert view["conversation_id"] is None or "/" not in view["conversation_id"], view["conversation_id"]
            if view["parent_turn_id"] is None:
                roots[f"{tenant}:{view['metadata'].get('label')}"].append(view)
            else:
                assert view["root_turn_id"] in {v["id"] for v in views}, "a child turn is listed for another tenant"

    # No accepted message lost, none started twice, each in its own tenant's conversation
    posted = accepted.messages()
    lost = [m.label for m in posted if f"{m.tenant}:{m.label}" not in roots]
    doubled = [name for name, views in roots.items() if len(views) > 1]
    assert lost == [] and doubled == [], f"{len(lost)} accepted messages lost: {lost}; started twice: {doubled}"
    assert len(roots) == len(posted), "a tenant sees turns it never started"
    [(failed_messages,)] = _sql(url, sa.select(_count(inbox_messages, inbox_messages.c.status == "FAILED")))
    assert failed_messages == 0

    # Every turn ended as its scenario leads, or cancelled by an interrupt accepted after it
    wrong: list[str] = []
    out_of_order: list[str] = []
    optional: list[str] = []
    expected: list[str] = []
    for conversation, answers in accepted.answers.items():
        interrupts = [i for i, m in enumerate(answers) if m.if_busy == "interrupt"]
        queued_starts: list[tuple[str, str]] = []
        for position, message in enumerate(answers):
            [view] = roots[f"{message.tenant}:{message.label}"]
            assert view["conversation_id"] == message.conversation
            interrupted = any(i > position for i in interrupts)
            if view["status"] == "CANCELLED" and interrupted:
                optional += message.scenario.effects
            elif view["status"] == message.scenario.expected.value:
                expected += message.scenario.effects
            else:
                wrong.append(f"{message.label} ({message.scenario.spec}): {view['status']} {view['error']}")
            if message.if_busy == "enqueue":
                queued_starts.append((view["created_at"], message.label))
        # Queued messages start in the order they were accepted (an interrupt may go first, by design)
        if [label for _, label in sorted(queued_starts)] != [label for _, label in queued_starts]:
            out_of_order.append(conversation)
    assert wrong == [], f"turns that ended in the wrong status: {wrong}"
    assert out_of_order == [], f"conversations whose queued messages started out of order: {out_of_order}"
    assert all(view["status"] in TERMINAL for view in by_id.values()), "a turn never ended"

    # No side effect happened twice (one idempotency key each), none is missing
    check_ledger(cluster, expected, optional)

    # The schedule's ticks ran too (the only turns without a tenant here), none visible to the tenants
    ticks_query = sa.select(turns.c.id, turns.c.status).where(turns.c.tenant_id == NO_TENANT)
    cluster.wait_for(
        lambda: all(status in TERMINAL for _, status in _sql(url, ticks_query)), 60, "the scheduled turns to end"
    )
    ticks = _sql(url, ticks_query)
    assert {status for _, status in ticks} <= {"COMPLETED"} and not {turn_id for turn_id, _ in ticks} & set(by_id)
    return len(ticks)


BROKERS = {"redis": None, "rabbitmq": RABBITMQ_URL}
"""The broker URL of each broker the runs are made on (None: the Redis of the leases)."""


SIZES = [
    # About half a minute on a quiet machine; the bound leaves room for a busy one.
    pytest.param(RunSize(conversations=2, per_conversation=10, max_kills=3, timeout=150), id="40-messages"),
    pytest.param(
        RunSize(conversations=10, per_conversation=50, max_kills=1_000, timeout=1_200),
        id="1000-messages",
        marks=[pytest.mark.slow, pytest.mark.timeout(1_500)],
    ),
]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("broker", list(BROKERS))
def test_two_tenants_with_every_feature_lose_reorder_repeat_and_leak_nothing_under_faults(
    broker: str,
    size: RunSize,
    make_cluster: Callable[..., Cluster],
    schema_url: str,
    admin: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    run_tenants_under_chaos(
        make_cluster,
        schema_url,
        admin,
        tmp_path,
        broker_url=BROKERS[broker],
        size=size,
    )
