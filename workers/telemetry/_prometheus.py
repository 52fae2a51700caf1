"""The prometheus-client side of `workers.telemetry.metrics`, imported on first use only."""

from __future__ import annotations

import glob
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    mmap_dict,
    multiprocess,
    start_http_server,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

logger = logging.getLogger("workers.telemetry")

# These two modules carry no type hints.
_multiprocess: Any = multiprocess
_MmapedDict: Any = mmap_dict.MmapedDict

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

_ADDITIVE_TYPES = ("counter", "histogram", "summary")
"""Metric files whose values add up across processes, so a dead process's file can be folded into one."""

ARCHIVE = "archive"
"""The pseudo process id of the files that hold the counts of processes that died."""


class PrometheusMetrics:
    """The metric objects, registered in the default registry of this process."""

    def __init__(self) -> None:
        self.steps = Counter(
            "agent_runner_steps", "Steps run, by agent and by what the step did.", ["agent_id", "kind"]
        )
        self.step_duration = Histogram(
            "agent_runner_step_duration_seconds",
            "Wall time of one step (model call, tool call, suspension...) including its saves.",
            ["agent_id", "kind"],
            buckets=STEP_BUCKETS,
        )
        self.turns_ended = Counter("agent_runner_turns_ended", "Turns that reached a terminal status.", ["status"])
        self.resumes = Counter(
            "agent_runner_resumes", "Resume commands, by action and whether they were accepted.", ["action", "outcome"]
        )
        self.retries = Counter("agent_runner_retries_scheduled", "Recoverable failures that scheduled another attempt.")
        self.limit_waits = Counter(
            "agent_runner_model_limit_waits",
            "Model calls that wait for a shared model limit, by limit key and reason.",
            ["limit_key", "reason"],
        )
        self.takeovers = Counter(
            "agent_runner_lease_takeovers", "Times a worker found that another worker took over its turn's lease."
        )
        self.queue_delay = Histogram(
            "agent_runner_queue_delay_seconds",
            "Time from a step being enqueued (or its ETA) to the step starting on a worker.",
            buckets=QUEUE_BUCKETS,
        )
        self.sweeps = Counter("agent_runner_sweeps", "Beat sweep runs.", ["sweep"])
        self.sweep_enqueued = Counter(
            "agent_runner_sweep_enqueued", "Items beat sweeps re-enqueued (turns, conversations).", ["sweep"]
        )
        self.admissions = Counter(
            "agent_runner_admissions",
            "New turns lined up for fair admission, by tenant and whether they had to wait.",
            ["tenant", "waited"],
        )
        # The counts live in Redis; every process sets them after each admission call, so the
        # value set last, by whichever process, is the current one.
        self.admission_waiting = Gauge(
            "agent_runner_admission_waiting",
            "New turns of a tenant waiting for admission.",
            ["tenant"],
            multiprocess_mode="mostrecent",
        )
        self.admission_in_flight = Gauge(
            "agent_runner_admission_in_flight",
            "Turns of a tenant admitted or running, not yet ended or waiting for a person.",
            ["tenant"],
            multiprocess_mode="mostrecent",
        )
        self._step_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def step(self, agent_id: str, kind: str, seconds: float) -> None:
        """Count a step and observe its duration (the labelled children are looked up once)."""
        key = (agent_id, kind)
        children = self._step_children.get(key)
        if children is None:
            children = self._step_children.setdefault(
                key, (self.steps.labels(agent_id, kind), self.step_duration.labels(agent_id, kind))
            )
        children[0].inc()
        children[1].observe(seconds)


# --- Exposition ---------------------------------------------------------------------------------


class CompactingMultiProcessCollector(Collector):
    """Merges the files of every process in a multiprocess directory, folding dead ones first.

    A prefork pool replaces its processes over time (`--max-tasks-per-child`, crashes), and
    each leaves one file per metric type. Before each collection the counter and histogram
    files of processes that no longer exist are added into one archive file per type and
    removed, so the directory stays as small as the live pool. Collection and folding hold
    one lock, so a scrape never sees a count twice or not at all.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._inner = _multiprocess.MultiProcessCollector(None, path=directory)

    def collect(self) -> Iterable[Metric]:
        """Fold dead processes' files, then merge every file."""
        with self._lock:
            compact_dead_processes(self.directory)
            return list(self._inner.collect())


def compact_dead_processes(directory: str) -> int:
    """Fold the additive metric files of dead processes into the archive files; return how many."""
    folded = 0
    for path in glob.glob(os.path.join(directory, "*.db")):
        kind, _, pid_text = os.path.basename(path)[: -len(".db")].partition("_")
        if kind not in _ADDITIVE_TYPES or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if _alive(pid):
            continue
        archive = _MmapedDict(os.path.join(directory, f"{kind}_{ARCHIVE}.db"))
        try:
            for key, value, timestamp, _ in _MmapedDict.read_all_values_from_file(path):
                total, _ = archive.read_value(key)
                archive.write_value(key, total + value, timestamp)
        finally:
            archive.close()
        os.remove(path)
        _multiprocess.mark_process_dead(pid, directory)
        folded += 1
    return folded


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _registry(directory: str | None) -> CollectorRegistry:
    if not directory:
        return REGISTRY
    registry = CollectorRegistry()
    registry.register(CompactingMultiProcessCollector(directory))
    return registry


_registries: dict[str, CollectorRegistry] = {}


def render(directory: str | None) -> tuple[bytes, str]:
    """The Prometheus text of the default registry, or of every process writing to `directory`."""
    registry = REGISTRY
    if directory:
        registry = _registries.get(directory) or _registries.setdefault(directory, _registry(directory))
    return generate_latest(registry), CONTENT_TYPE_LATEST


@dataclass
class MetricsServer:
    """A `/metrics` HTTP server running on a daemon thread."""

    port: int
    addr: str
    _server: Any
    _thread: threading.Thread

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def forget_in_child(self) -> None:
        """In a process forked from the server's (a pool process), close the inherited listening socket.

        The serving thread did not survive the fork; only the socket did, and it would keep
        the port bound as long as the child lives.
        """
        self._server.socket.close()


def serve(port: int, addr: str, directory: str | None) -> MetricsServer:
    """Start a `/metrics` server for the default registry, or for the processes writing to `directory`."""
    server, thread = start_http_server(port, addr, registry=_registry(directory))
    return MetricsServer(port=server.server_port, addr=addr, _server=server, _thread=thread)


def mark_process_dead(pid: int, directory: str) -> None:
    """Remove the live-gauge files of `pid`."""
    _multiprocess.mark_process_dead(pid, directory)
