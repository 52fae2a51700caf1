"""Traces and metrics of a turn tree run by real Celery worker processes on PostgreSQL and Redis.

The workers export spans with their real OTLP exporter, configured by the standard OTEL_*
variables, to a receiver in this test that writes them as JSON lines. The test process is
the web app: it creates the turn inside a request span and resumes it from other requests.
The first steps run on one worker; it is stopped and a second one, whose pool processes
are replaced every two tasks, runs the rest. Both serve `/metrics`, scraped over HTTP.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from agent_runner import (
    AgentResumeCommand,
    AgentRunner,
    AgentTurn,
    AgentTurnStatus,
    InMemoryAgentLoader,
)
from tests.helpers.celery_fleet import WorkerProcess
from tests.helpers.metrics import free_port, scrape
from tests.integration.celery_workers.celery_cluster import Cluster
from tests.integration.telemetry.otlp_receiver import otlp_receiver, read_spans
from tests.integration.telemetry.telemetry_agents import CHILDREN, MODEL_NAME, USAGE, build_agents
from workers.telemetry import instrument

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


class Tracing:
    """The web app's tracer provider: spans kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


def total(samples: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]], name: str, **labels: str) -> float:
    """The sum over workers of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for sample in samples for (n, pairs), v in sample.items() if n == name and wanted <= set(pairs))


def _producer(cluster: Cluster, provider: Any) -> AgentRunner:
    """The web app's runner: same store and queue as the workers, spans to the test's provider."""
    wiring = cluster.wiring
    runner = AgentRunner(
        turn_store=wiring.turn_store,
        agent_loader=InMemoryAgentLoader(build_agents()),
        policy=cluster.settings.policy(),
        dispatcher=wiring.dispatcher,
        conversation_guard=wiring.guard,
    )
    instrument(runner, tracer_provider=provider)
    return runner


def _wait_status(cluster: Cluster, turn_id: str, status: AgentTurnStatus) -> AgentTurn:
    cluster.wait_for(lambda: cluster.load(turn_id).status is status, TIMEOUT_S, f"turn {turn_id} {status}")
    return cluster.load(turn_id)


def _step_tasks_done(log: str) -> int:
    return len(re.findall(r"Task agent_runner\.step_turn\[[0-9a-f-]+\] succeeded", log))


def _idle(worker: WorkerProcess) -> Callable[[], bool]:
    def idle() -> bool:
        log = worker.output()
        received = set(re.findall(r"Task agent_runner\.\w+\[([0-9a-f-]+)\] received", log))
        done = set(re.findall(r"Task agent_runner\.\w+\[([0-9a-f-]+)\] (?:succeeded|raised)", log))
        return received <= done

    return idle


def test_a_turn_tree_across_two_workers_is_one_trace_and_the_metrics_count_it(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    with otlp_receiver(spans_file) as endpoint:
        cluster = make_cluster(
            AGENT_RUNNER_AGENT_LOADER="tests.integration.telemetry.telemetry_agents:build_loader",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_BSP_SCHEDULE_DELAY="100",
            OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="process",
            AGENT_RUNNER_METRICS_ADDR="127.0.0.1",
        )
        tracing = Tracing()
        producer = _producer(cluster, tracing.provider)
        client = tracing.provider.get_tracer("web-app")
        resumes_before = {
            action: REGISTRY.get_sample_value("agent_runner_resumes_total", {"action": action, "outcome": "accepted"})
            or 0.0
            for action in ("form", "approve")
        }

        # Given a first worker, and a turn created inside a request span of the web app
        ports = (free_port(), free_port())
        w1 = cluster.start_worker("w1", env={"AGENT_RUNNER_METRICS_PORT": str(ports[0])})
        with client.start_as_current_span("POST /v1/turns") as create_request:
            turn = producer.start("tour", "tour-1")

        # When the first worker runs it up to its form, and is scraped and stopped
        _wait_status(cluster, turn.id, AgentTurnStatus.WAITING_FOR_USER)
        cluster.wait_for(_idle(w1), TIMEOUT_S, "w1 idle")
        first = scrape(ports[0])
        w1.stop()

        # And a second worker (pool processes replaced every two tasks, JSON logs) and a beat run the rest
        w2 = cluster.start_worker(
            "w2",
            extra_args=["--max-tasks-per-child=2"],
            env={"AGENT_RUNNER_METRICS_PORT": str(ports[1]), "AGENT_RUNNER_LOG_FORMAT": "json"},
        )
        cluster.start_beat()
        with client.start_as_current_span("POST /v1/turns/resume form") as form_request:
            producer.submit_resume(turn.id, AgentResumeCommand.user_input(_call_id(cluster, turn.id), {"value": "v"}))
        _wait_status(cluster, turn.id, AgentTurnStatus.WAITING_FOR_APPROVAL)
        with client.start_as_current_span("POST /v1/turns/resume approve") as approve_request:
            producer.submit_resume(turn.id, AgentResumeCommand.approve_tool(_call_id(cluster, turn.id)))
        root = _wait_status(cluster, turn.id, AgentTurnStatus.COMPLETED)
        children = [cluster.load(link.child_turn_id) for link in root.children]
        assert len(children) == CHILDREN and all(c.status is AgentTurnStatus.COMPLETED for c in children)

        # Then (spans) the whole tree is one trace: the request's
        steps_expected = root.steps + sum(c.steps for c in children)
        cluster.wait_for(
            lambda: len([s for s in read_spans(spans_file) if s["name"].startswith("step ")]) >= steps_expected,
            TIMEOUT_S,
            "the step spans to be exported",
        )
        time.sleep(0.5)  # the chat and tool spans of the last steps end before them, but make sure
        spans = read_spans(spans_file)
    trace_id = format(create_request.get_span_context().trace_id, "032x")
    assert {s["trace_id"] for s in spans} == {trace_id}
    assert {s["service"] for s in spans} == {"agent-runner-worker"}
    assert len({s["span_id"] for s in spans}) == len(spans)  # nothing exported twice
    by_id = {s["span_id"]: s for s in spans}

    # And the turn's steps are children of its creation in the web app, whichever worker ran them
    (created,) = tracing.named("create_turn tour")
    assert created.parent is not None and created.parent.span_id == create_request.get_span_context().span_id
    root_steps = [s for s in spans if s["name"] == "step tour"]
    assert len(root_steps) == root.steps
    assert {s["parent_span_id"] for s in root_steps} == {format(created.context.span_id, "016x")}
    pids = {s["resource_pid"] for s in root_steps}
    assert len(pids) >= 3, pids  # w1's pool process, then several of w2's

    # And each child was created by the parent's delegating step, with its steps below its creation
    child_created = [s for s in spans if s["name"] == "create_turn part-worker"]
    assert len(child_created) == CHILDREN
    for span in child_created:
        assert by_id[span["parent_span_id"]]["attributes"]["agent_runner.step.kind"] == "children"
        steps = [s for s in spans if s["parent_span_id"] == span["span_id"]]
        assert {s["name"] for s in steps} == {"step part-worker"}
        child_id = span["attributes"]["agent_runner.turn.id"]
        assert len(steps) == next(c.steps for c in children if c.id == child_id)

    # And model and tool calls carry the GenAI attributes
    chats = [s for s in spans if s["name"].startswith("chat ")]
    assert len(chats) == root.model_iterations + sum(c.model_iterations for c in children)
    for chat in chats:
        assert chat["name"] == f"chat {MODEL_NAME}"
        attributes = chat["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == MODEL_NAME
        assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
            USAGE.input_tokens,
            USAGE.output_tokens,
        )
        assert by_id[chat["parent_span_id"]]["name"].startswith("step ")
    tools = sorted(
        (s["attributes"]["gen_ai.tool.name"], s["status"]) for s in spans if s["name"].startswith("execute_")
    )
    error, unset = 2, 0
    assert (
        tools
        == [("approved_write", unset), ("flaky_write", unset), ("flaky_write", error)]
        + [("ledger_write", unset)] * CHILDREN
    )
    for span in spans:
        if span["name"].startswith("execute_tool "):
            assert span["attributes"]["gen_ai.operation.name"] == "execute_tool"
            assert span["attributes"]["gen_ai.tool.call.id"].startswith("call-")

    # And the steps a request caused link to it; steps enqueued by steps link to those
    links = [(link, s) for s in root_steps for link in s["links"]]
    linked_requests = {link["span_id"] for link, _ in links if link["trace_id"] != trace_id}
    assert {
        format(form_request.get_span_context().span_id, "016x"),
        format(approve_request.get_span_context().span_id, "016x"),
    } <= linked_requests
    assert any(link["agent_runner.link"] == "enqueued_by" and link["span_id"] in by_id for link, _ in links)

    # Then (metrics) the two workers' counters add up to what the tree did
    second = scrape(ports[1])
    cluster.wait_for(
        lambda: all(
            total([scrape(ports[1])], "agent_runner_sweeps_total", sweep=sweep) >= 1
            for sweep in ("inbox", "stale_turns", "due_retries", "deadlines")
        ),
        TIMEOUT_S,
        "one run of each sweep",
    )
    second = scrape(ports[1])
    both = [first, second]
    for agent_id, turns in (("tour", [root]), ("part-worker", children)):
        counted = sum(
            total(both, "agent_runner_steps_total", agent_id=agent_id, kind=kind)
            for kind in ("model", "tool", "suspend", "children", "terminal")
        )
        assert counted == sum(t.steps for t in turns), agent_id
        assert total(both, "agent_runner_steps_total", agent_id=agent_id, kind="model") == sum(
            t.model_iterations for t in turns
        )
        assert total(both, "agent_runner_step_duration_seconds_count", agent_id=agent_id) == total(
            both, "agent_runner_steps_total", agent_id=agent_id
        )
    assert total(both, "agent_runner_steps_total", kind="error") == 0
    assert total(both, "agent_runner_turns_ended_total", status="COMPLETED") == 1 + CHILDREN
    assert total(both, "agent_runner_retries_scheduled_total") == 1
    assert total(both, "agent_runner_resumes_total", action="retry_due", outcome="accepted") == 1
    assert total(both, "agent_runner_resumes_total", action="child_completed", outcome="accepted") == 1
    assert total(both, "agent_runner_lease_takeovers_total") == 0
    step_tasks = _step_tasks_done(w1.output()) + _step_tasks_done(w2.output())
    assert total(both, "agent_runner_queue_delay_seconds_count") == step_tasks > 0
    assert total(both, "agent_runner_queue_delay_seconds_sum") > 0
    # The form and the approval were accepted in the web app's process, and counted there
    for action, before in resumes_before.items():
        after = REGISTRY.get_sample_value("agent_runner_resumes_total", {"action": action, "outcome": "accepted"})
        assert (after or 0.0) - before == 1, action

    # And the replaced pool processes' counts were folded, not lost
    directory = re.search(r"collected from the pool processes in (\S+?)\"", w2.output())
    assert directory is not None, w2.output()[-3000:]
    assert (Path(directory.group(1)) / "counter_archive.db").exists()

    # And the JSON log lines of a step task name its turn
    lines = [line for line in w2.output().splitlines() if line.startswith("{") and "step_turn" in line]
    assert lines and all('"turn_id": "' in line for line in lines if "succeeded" in line)


def _call_id(cluster: Cluster, turn_id: str) -> str:
    suspension = cluster.load(turn_id).suspension
    assert suspension is not None and suspension.correlation_id is not None
    return suspension.correlation_id
