"""Prometheus metrics of an instrumented runner, the `/metrics` text, and the multiprocess directory."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent_runner import (
    Agent,
    AgentResumeCommand,
    AgentTurnStatus,
    AiMessage,
    LeaseLostError,
    ScriptedChatModel,
)
from tests.unit.telemetry.telemetry_kit import build_agent, drive, new_runner
from workers.telemetry import (
    TelemetryError,
    instrument,
    metrics_enabled,
    record_resume,
    render_metrics,
    resume_action,
    set_metrics_enabled,
)
from workers.telemetry import metrics as telemetry_metrics
from workers.telemetry._prometheus import render
from workers.telemetry.metrics import RESUME_ACTIONS, record_sweep, resume_action_of_event, serve_metrics

ROOT = Path(__file__).resolve().parents[3]
CONTRACT_NAMES = (
    "agent_runner_steps_total",
    "agent_runner_step_duration_seconds",
    "agent_runner_turns_ended_total",
    "agent_runner_resumes_total",
    "agent_runner_retries_scheduled_total",
    "agent_runner_lease_takeovers_total",
    "agent_runner_queue_delay_seconds",
)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """Samples of the default registry before and after a block."""

    def __init__(self, *keys: tuple[str, dict[str, str]]) -> None:
        self.keys = keys
        self.before = [sample(name, **labels) for name, labels in keys]

    def __call__(self) -> list[float]:
        return [sample(name, **labels) - old for (name, labels), old in zip(self.keys, self.before, strict=True)]


@pytest.fixture(autouse=True)
def _default_switch() -> Iterator[None]:
    set_metrics_enabled(None)
    yield
    set_metrics_enabled(None)


def test_the_scenario_moves_each_counter_by_what_happened() -> None:
    runner = new_runner()
    instrument(runner, tracing=False)
    kinds = ("model", "tool", "suspend", "children")
    keys = [("agent_runner_steps_total", {"agent_id": "assistant", "kind": kind}) for kind in kinds]
    keys += [("agent_runner_steps_total", {"agent_id": "helper", "kind": kind}) for kind in ("model", "tool")]
    keys += [
        ("agent_runner_step_duration_seconds_count", {"agent_id": "assistant", "kind": "model"}),
        ("agent_runner_turns_ended_total", {"status": "COMPLETED"}),
        ("agent_runner_retries_scheduled_total", {}),
        *[
            ("agent_runner_resumes_total", {"action": action, "outcome": "accepted"})
            for action in ("form", "approve", "retry", "child_completed", "input", "retry_due")
        ],
    ]
    delta = Delta(*keys)

    turn = drive(runner, build_agent())

    assert turn.status is AgentTurnStatus.COMPLETED
    # assistant: 5 model calls, 2 suspensions (form, approval), 4 tool steps (approved write,
    # the failed and the retried flaky write, the child's answer written back), 1 delegation;
    # helper: 2 model calls and 1 tool call; two turns completed; one retry; one resume of each kind
    assert delta() == [5, 4, 2, 1, 2, 1, 5, 2, 1, 1, 1, 1, 1, 0, 0]
    assert turn.steps == 12


def test_a_lease_lost_mid_step_counts_a_takeover_and_an_error_step() -> None:
    runner = new_runner()
    instrument(runner, tracing=False)
    agent = Agent(id="fenced", chat_model=ScriptedChatModel([AiMessage(content="hello")]))
    turn = runner.start(agent, "hi")
    runner.turn_store.save(turn.model_copy(update={"lease_fence": 5}), turn.version)
    delta = Delta(
        ("agent_runner_lease_takeovers_total", {}),
        ("agent_runner_steps_total", {"agent_id": "fenced", "kind": "error"}),
    )

    with pytest.raises(LeaseLostError):
        runner.step(runner.turn_store.load(turn.id).model_copy(update={"lease_fence": 4}))

    assert delta() == [1, 1]


def test_metrics_switched_off_count_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_RUNNER_METRICS", "off")
    assert not metrics_enabled()
    runner = new_runner()
    instrument(runner, tracing=False)
    delta = Delta(("agent_runner_turns_ended_total", {"status": "COMPLETED"}))

    drive(runner, build_agent())

    assert delta() == [0]


def test_rejected_resumes_are_counted_with_a_bounded_action() -> None:
    delta = Delta(("agent_runner_resumes_total", {"action": "approve", "outcome": "rejected"}))

    record_resume(resume_action(AgentResumeCommand.approve_tool("call-1")), "rejected")

    assert delta() == [1]
    with pytest.raises(TelemetryError, match="action='approve_everything'"):
        record_resume("approve_everything", "rejected")
    with pytest.raises(TelemetryError, match="outcome='maybe'"):
        record_resume("approve", "maybe")
    with pytest.raises(TelemetryError, match="sweep='everything'"):
        record_sweep("everything", 1)


def test_resume_commands_map_to_their_action_labels() -> None:
    assert resume_action(AgentResumeCommand.user_input("O-1001")) == "input"
    assert resume_action(AgentResumeCommand.user_input("call-1", {"field": 1})) == "form"
    assert resume_action(AgentResumeCommand.approve_tool("call-1")) == "approve"
    assert resume_action(AgentResumeCommand.reject_tool("call-1", reason="no")) == "reject"
    assert resume_action(AgentResumeCommand.retry()) == "retry"
    assert resume_action(AgentResumeCommand.child_completed("t-1")) == "child_completed"
    assert resume_action(AgentResumeCommand.tool_result("call-1", "paid")) == "tool_result"
    assert resume_action(AgentResumeCommand.deadline_passed("call-1")) == "deadline"


@pytest.mark.parametrize(
    ("data", "action"),
    [
        ({"command": "USER_INPUT", "tool_call_id": None}, "input"),
        ({"command": "USER_INPUT", "tool_call_id": "call-form"}, "form"),
        ({"command": "APPROVE_TOOL", "tool_call_id": "c1"}, "approve"),
        ({"command": "TOOL_RESULT", "tool_call_id": "c1"}, "tool_result"),
        ({"command": "DEADLINE", "tool_call_id": "c1"}, "deadline"),
        ({"reason": "retry due", "attempt": 2}, "retry_due"),
        ({"reason": "model limit wait over", "attempt": 0}, "limit_wait_over"),
    ],
)
def test_resume_events_map_to_the_action_labels_of_their_commands(data: dict[str, Any], action: str) -> None:
    assert resume_action_of_event(data) == action
    assert action in RESUME_ACTIONS


def test_a_resume_event_of_an_unknown_command_is_not_counted_under_another_label() -> None:
    with pytest.raises(TelemetryError, match="SOMETHING_NEW"):
        resume_action_of_event({"command": "SOMETHING_NEW"})


def test_the_metrics_text_names_every_metric_of_the_contract() -> None:
    body, content_type = render_metrics()
    text = body.decode()
    assert content_type.startswith("text/plain")
    for name in CONTRACT_NAMES:
        kind = "counter" if name.endswith("_total") else "histogram"
        assert f"# TYPE {name} {kind}\n" in text, name


def test_a_metrics_server_serves_the_text_over_http() -> None:
    runner = new_runner()
    instrument(runner, tracing=False)
    drive(runner, build_agent())
    server = serve_metrics(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    assert 'agent_runner_steps_total{agent_id="helper",kind="tool"}' in text


_RECORD = """
import os, sys
from workers.telemetry import metrics
metrics.record_step("worker-agent", "model", 0.2)
metrics.record_step("worker-agent", "model", 3.0)
metrics.record_turn_ended("COMPLETED")
metrics.record_queue_delay(0.05)
if sys.argv[1:] == ["wait"]:
    print("READY", os.getpid(), flush=True)
    sys.stdin.readline()
"""


def _recorder(directory: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    env.pop("AGENT_RUNNER_METRICS", None)
    return subprocess.Popen(
        [sys.executable, "-c", _RECORD, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _value(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in\n{text}")


def test_processes_sharing_a_directory_add_up_and_dead_ones_are_folded_into_one_archive(tmp_path: Path) -> None:
    # Given two processes that recorded and exited, and one that recorded and is still running
    for _ in range(2):
        done = _recorder(tmp_path)
        done.communicate(timeout=60)
        assert done.returncode == 0
    with _recorder(tmp_path, "wait") as live:
        assert live.stdout is not None and live.stdin is not None
        ready = live.stdout.readline().split()
        assert ready[0] == "READY"
        live_pid = int(ready[1])

        # When the directory is scraped (twice: the first scrape folds the dead processes' files)
        first = render(str(tmp_path))[0].decode()
        second = render(str(tmp_path))[0].decode()
        live.communicate("\n", timeout=60)

    # Then every process's counts are there, once
    for text in (first, second):
        assert _value(text, 'agent_runner_steps_total{agent_id="worker-agent",kind="model"}') == 6
        assert _value(text, 'agent_runner_turns_ended_total{status="COMPLETED"}') == 3
        assert _value(text, "agent_runner_queue_delay_seconds_count") == 3
        bucket = 'agent_runner_step_duration_seconds_bucket{agent_id="worker-agent",kind="model",le="0.25"}'
        assert _value(text, bucket) == 3
        assert _value(text, 'agent_runner_step_duration_seconds_count{agent_id="worker-agent",kind="model"}') == 6
    # And only the live process keeps files of its own; the dead ones were folded into the archives
    files = {p.name for p in tmp_path.glob("*.db")}
    assert files == {"counter_archive.db", f"counter_{live_pid}.db", "histogram_archive.db", f"histogram_{live_pid}.db"}


def test_preparing_the_multiprocess_directory_empties_it_and_exports_it(tmp_path: Path) -> None:
    # In a fresh process: preparing switches prometheus-client to multiprocess mode for good.
    stale = tmp_path / "counter_99999999.db"
    stale.write_bytes(b"left by an earlier run")
    (tmp_path / "notes.txt").write_text("not a metrics file")
    code = f"""
import os, prometheus_client
from workers.telemetry import metrics
directory, created = metrics.prepare_multiprocess_dir({str(tmp_path)!r})
metrics.record_turn_ended("FAILED")
print(directory == os.environ["PROMETHEUS_MULTIPROC_DIR"], created, sorted(os.listdir(directory)))
del os.environ["PROMETHEUS_MULTIPROC_DIR"]
fresh, created = metrics.prepare_multiprocess_dir(None)
print(created, fresh != directory)
metrics.remove_multiprocess_dir(fresh)
print(os.path.exists(fresh))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "AGENT_RUNNER_METRICS")}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("True False [")
    assert "counter_99999999.db" not in lines[0] and "notes.txt" in lines[0]
    assert "'counter_" in lines[0]  # the new count went to this process's file
    assert lines[1:] == ["True True", "False"]


def test_the_metrics_are_off_without_prometheus_client(tmp_path: Path) -> None:
    assert telemetry_metrics.metrics_available()
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from workers.telemetry import metrics\n"
        "metrics.record_step('a', 'model', 1.0); metrics.record_lease_takeover(); metrics.mark_process_dead(1)\n"
        "print(metrics.metrics_available(), metrics.metrics_enabled())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False False"


def test_a_pool_process_forked_after_the_server_started_lets_go_of_its_socket() -> None:
    # The server thread does not survive a fork; the listening socket would, and keep the port bound.
    code = """
import os, urllib.request
from workers.telemetry.metrics import serve_metrics
server = serve_metrics(0, "127.0.0.1")
pid = os.fork()
if pid == 0:
    server.forget_in_child()
    os._exit(0 if server._server.socket.fileno() == -1 else 1)
_, status = os.waitpid(pid, 0)
with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
    served = response.status
server.close()
print(os.waitstatus_to_exitcode(status), served)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "200"]


def test_a_wait_for_a_model_limit_is_counted_by_key_and_reason_and_not_as_a_retry() -> None:
    from agent_runner import AgentRunner, InProcessModelLimiter, ModelLimit

    # Given a runner whose model may call once a second
    limiter = InProcessModelLimiter({"scripted:metrics": ModelLimit(rpm=60)})
    runner = AgentRunner(model_limiter=limiter)
    instrument(runner, tracing=False)
    model = ScriptedChatModel(lambda request: AiMessage("done"), rate_limit_key="scripted:metrics")
    agent = Agent(id="limited-metrics", chat_model=model)
    delta = Delta(
        ("agent_runner_model_limit_waits_total", {"limit_key": "scripted:metrics", "reason": "rpm"}),
        ("agent_runner_retries_scheduled_total", {}),
    )
    # When two turns call at once, then the second waits, counted as a limit wait only
    statuses = [runner.run(agent, "hi").status for _ in range(2)]
    assert statuses == [AgentTurnStatus.COMPLETED, AgentTurnStatus.RETRY_SCHEDULED]
    assert delta() == [1, 0]


def test_admissions_are_counted_and_the_tenant_gauges_set_by_tenant() -> None:
    from workers.telemetry import record_admission, set_admission_gauges

    delta = Delta(
        ("agent_runner_admissions_total", {"tenant": "acme", "waited": "true"}),
        ("agent_runner_admissions_total", {"tenant": "none", "waited": "false"}),
    )
    # When one turn of acme waits, and one without a tenant is admitted at once
    record_admission("acme", waited=True)
    record_admission(None, waited=False)
    set_admission_gauges("acme", 7, 3)
    # Then each is counted under its tenant, and the gauges hold the last counts reported
    assert delta() == [1, 1]
    assert sample("agent_runner_admission_waiting", tenant="acme") == 7
    assert sample("agent_runner_admission_in_flight", tenant="acme") == 3
