"""Real `celery -A workers.app worker` (and `beat`) processes for the tests: start, wait until ready, stop, kill.

Every process runs in a session of its own, so its pid is the id of a process group
holding it and every process it forked (a prefork pool). A worker is stopped as an operator
stops one: SIGTERM to the main process, which lets its pool finish the tasks it runs, then
SIGKILL to the whole group when it does not exit in time. Chaos tests SIGKILL the group at
once (`WorkerProcess.kill`). Each process writes its output to a log file in the fleet's
folder; `keep_logs` copies a failed test's logs to the artifacts folder.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.processes import REPO_ROOT, signal_group

CELERY = str(Path(sys.executable).with_name("celery"))
"""The `celery` command of the virtual environment running the tests."""
WORKER_START_TIMEOUT_S = 45.0
WORKER_STOP_TIMEOUT_S = 15.0
ARTIFACTS = Path(os.environ.get("AGENT_RUNNER_TEST_ARTIFACTS", REPO_ROOT / "tests" / "artifacts"))
"""Where the logs of a failed test's processes are kept (one folder per test)."""


@dataclass
class WorkerProcess:
    """A `celery worker` (or `celery beat`) process started by a test."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM to the main process only (warm shutdown); `stop` waits for it.

        A prefork child that got a SIGTERM of its own would die mid-task, so the group is
        not signalled.
        """
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the whole process group: the main process and its pool children die at once."""
        signal_group(self.pid, signal.SIGKILL)
        self.process.wait(WORKER_STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM (warm shutdown), then SIGKILL after a bound; always reaps the process group."""
        self.terminate()
        try:
            self.process.wait(WORKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        # Pool children may outlive a main process that died first.
        signal_group(self.pid, signal.SIGKILL)
        if self.alive():
            self.process.wait(WORKER_STOP_TIMEOUT_S)


@dataclass
class CeleryFleet:
    """The Celery processes of one test, on one environment, with their logs in `tmp_path`."""

    env: dict[str, str]
    tmp_path: Path
    processes: list[WorkerProcess] = field(default_factory=list)

    def start_worker(
        self,
        name: str,
        concurrency: int = 2,
        wait: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        pool: str = "prefork",
        queues: Sequence[str] = (),
    ) -> WorkerProcess:
        """Start a worker; `extra_args` go to `celery worker`, `env` overrides this worker's environment.

        With `pool="threads"` (or `"solo"`) every task runs in the worker's own process, so
        the worker's pid is the pid of the process that runs the tools. Without `queues` the
        worker consumes the queues the application declares.
        """
        args = [
            CELERY,
            "-A",
            "workers.app",
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            f"--hostname={name}-{uuid.uuid4().hex[:6]}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
            *([f"--queues={','.join(queues)}"] if queues else []),
            *extra_args,
        ]
        worker = self.spawn(name, args, env)
        if wait:
            self.wait_ready(worker)
        return worker

    def start_workers(
        self,
        count: int,
        concurrency: int = 2,
        env: Mapping[str, str] | None = None,
        pool: str = "prefork",
        queues: Sequence[str] = (),
    ) -> list[WorkerProcess]:
        """Start `count` workers side by side (`w1`, `w2`...) and wait until each is ready.

        They start in parallel, which is much faster than one after the other.
        """
        workers = [
            self.start_worker(f"w{i + 1}", concurrency, wait=False, env=env, pool=pool, queues=queues)
            for i in range(count)
        ]
        self.wait_ready(*workers)
        return workers

    def start_beat(self, name: str = "beat") -> WorkerProcess:
        """Start `celery beat`; each name keeps its own schedule file, as beats on two hosts would."""
        args = [
            CELERY,
            "-A",
            "workers.app",
            "beat",
            "--loglevel=INFO",
            f"--schedule={self.tmp_path / f'{name}-schedule'}",
        ]
        return self.spawn(name, args)

    def spawn(self, name: str, args: list[str], env: Mapping[str, str] | None = None) -> WorkerProcess:
        """Start `args` in a session of its own, its output in a log file of the fleet."""
        log = self.tmp_path / f"{name}-{len(self.processes)}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                args,
                cwd=REPO_ROOT,
                env={**self.env, **(env or {})},
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProcess(name, process, log)
        self.processes.append(worker)
        return worker

    def wait_ready(self, *workers: WorkerProcess) -> None:
        """Wait until each worker logged that it is ready; fail the test with its log if it exits or takes too long."""
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        for worker in workers:
            while " ready." not in worker.output():
                if not worker.alive():
                    pytest.fail(
                        f"worker {worker.name} exited with {worker.process.returncode}:\n{worker.output()[-4000:]}"
                    )
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"worker {worker.name} not ready after {WORKER_START_TIMEOUT_S}s:\n{worker.output()[-4000:]}"
                    )
                time.sleep(0.1)

    def worker_holding(self, pid: int) -> WorkerProcess:
        """The worker whose process group holds the (pool) process `pid`: each worker leads its own group."""
        group = os.getpgid(pid)
        for worker in self.processes:
            if worker.pid == group:
                return worker
        raise AssertionError(f"process {pid} (group {group}) belongs to no worker of this test")

    def stop_all(self) -> None:
        """Stop every process: all are asked to shut down at once, then each is waited for (and killed if need be)."""
        for worker in self.processes:
            worker.terminate()
        for worker in self.processes:
            worker.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {w.name} (pid {w.pid})\n{w.output()[-6000:]}" for w in self.processes)


def keep_logs(folder: Path, test_id: str) -> Path | None:
    """Copy the `*.log` files under `folder` to a folder of the artifacts named after `test_id`; return it.

    The tests' processes write their logs in the test's `tmp_path`, which pytest deletes a
    few runs later; a failed test's logs are kept where a CI job can upload them.
    """
    logs = sorted(folder.rglob("*.log")) if folder.is_dir() else []
    if not logs:
        return None
    target = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id).strip("_")[:200]
    for log in logs:
        copied = target / log.relative_to(folder)
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, copied)
    return target
