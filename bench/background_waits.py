"""Threads held by background model waits: many turns waiting on background responses in one embedded worker.

Each turn's model (`OpenAIResponsesModel(background=True)`) starts a response on a local
fake Responses API that stays in progress for `--polls` looks, then answers. The script
starts N turns on an `AgentWorker` (in-memory store), samples the process's threads while
they wait, and reports the peak, the wall time until every turn completed, and the number
of responses created (one per turn when none is started twice).

    python -m bench.background_waits --turns 10 1000
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from agent_runner import Agent, AgentRunner, AgentTurnStatus, AgentWorker, InMemoryAgentLoader, InMemoryAgentTurnStore
from agent_runner.models.openai import OpenAIResponsesModel
from tests.helpers import responses_wire as wire
from tests.helpers.background_responses import BackgroundResponses, Outcome
from tests.helpers.fake_openai import FakeChatServer


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def measure(turns: int, polls: int, concurrency: int) -> dict[str, float]:
    responses = BackgroundResponses(*(Outcome([wire.text("done")], polls=polls) for _ in range(turns)))
    server = FakeChatServer(answer=responses)
    model = OpenAIResponsesModel("o4-mini", api_key="k", base_url=server.base_url, background=True)
    agent = Agent(id="thinker", chat_model=model)
    store = InMemoryAgentTurnStore()
    runner = AgentRunner(turn_store=store, agent_loader=InMemoryAgentLoader([agent]))
    worker = AgentWorker(runner, concurrency=concurrency, poll_interval=0.2, deadline_interval=None)
    before = os_threads()
    worker.start()
    started = time.monotonic()
    try:
        ids = [runner.start(agent, f"think {n}").id for n in range(turns)]
        peak = before
        while True:
            peak = max(peak, os_threads())
            statuses = [store.load(turn_id).status for turn_id in ids]
            if all(s is AgentTurnStatus.COMPLETED for s in statuses):
                break
            if time.monotonic() - started > 600:
                raise TimeoutError(f"{turns} turns did not complete in 600 s")
            time.sleep(0.1)
        elapsed = time.monotonic() - started
    finally:
        worker.stop()
        model.close()
        server.close()
    return {
        "turns": turns,
        "responses_created": len(responses.created),
        "reads": responses.reads,
        "threads_before": before,
        "threads_peak": peak,
        "python_threads_after": threading.active_count(),
        "seconds_to_complete_all": round(elapsed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--polls", type=int, default=2, help="looks at each response before it completes")
    parser.add_argument("--concurrency", type=int, default=4, help="the worker's stepping threads")
    options = parser.parse_args()
    for turns in options.turns:
        print(json.dumps(measure(turns, options.polls, options.concurrency)))


if __name__ == "__main__":
    main()
