"""Engine overhead per step on the in-memory store, and how it changes with history length.

Workload W (see `_common`): one turn = K tool calls, one per model response from a
scripted model (no network), then a final answer (K=10 -> 21 steps). Reported as medians
of several repetitions with min and max, and as ratios against a baseline measured in the
same run: the bare cost of calling the tool and the scripted model directly, with no runner.

Histories: explicit (`history=`, copied into the turn) of 10 and 500 messages, and a
conversation (InMemoryChatMemoryProvider) that already holds 500 messages, attached with a
window of 500.

Run: `python bench/step_overhead.py [--quick] [--json PATH] [--repeats N]`.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

from _common import (
    Stat,
    WorkloadModel,
    arguments,
    log,
    lookup,
    prior_messages,
    steps_per_turn,
    w_agent,
    write_results,
)

from agent_runner import (
    AgentExecutionPolicy,
    AgentRunner,
    ChatRequest,
    InMemoryAgentTurnStore,
    InMemoryChatMemoryProvider,
    ToolMessage,
    UserMessage,
)


def run_turns(k: int, turns: int, history: int = 0, conversation: bool = False) -> tuple[float, int]:
    """Run `turns` turns of W(k) on a fresh in-memory runner; return (seconds, steps)."""
    memories = InMemoryChatMemoryProvider()
    runner = AgentRunner(
        turn_store=InMemoryAgentTurnStore(),
        chat_memory_provider=memories,
        policy=AgentExecutionPolicy(max_steps=10 * k + 10),
    )
    agent = w_agent(k, window=max(50, history))
    prior = prior_messages(history)
    if conversation:
        memories("c").append(prior)
    steps = 0
    start = time.perf_counter()
    for _ in range(turns):
        if conversation:
            turn = runner.run(agent, "check my orders", conversation_id="c")
        else:
            turn = runner.run(agent, "check my orders", history=prior)
        if turn.status != "COMPLETED":
            raise RuntimeError(f"turn ended {turn.status}")
        steps += turn.steps
    return time.perf_counter() - start, steps


def baseline(k: int, turns: int) -> tuple[float, int]:
    """The same model and tool calls with no runner: what the workload costs by itself."""
    model = WorkloadModel(k)
    start = time.perf_counter()
    steps = 0
    for _ in range(turns):
        messages: list[Any] = [UserMessage("check my orders")]
        while True:
            response = model.generate(ChatRequest.model_construct(messages=messages, tools=[], on_delta=None))
            messages.append(response.message)
            steps += 1
            if not response.message.tool_calls:
                break
            for call in response.message.tool_calls:
                messages.append(ToolMessage(call.id, call.name, lookup.invoke(call.arguments)))
                steps += 1
    return time.perf_counter() - start, steps


def _rates(fn: Callable[[], tuple[float, int]], repeats: int) -> list[float]:
    rates = []
    for _ in range(repeats):
        gc.collect()
        seconds, steps = fn()
        rates.append(steps / seconds)
    return rates


WORKLOADS = (
    # label, K, history, conversation
    ("W K=10", 10, 0, False),
    ("W K=50", 50, 0, False),
    ("W K=200", 200, 0, False),
    ("W K=10, 10 prior (explicit)", 10, 10, False),
    ("W K=10, 500 prior (explicit)", 10, 500, False),
    ("W K=10, 500 prior (conversation, window 500)", 10, 500, True),
)


def measure(repeats: int, turns: int) -> dict[str, Any]:
    run_turns(10, 20)  # warm-up
    baseline(10, 20)
    base_rates: list[float] = []
    results: dict[str, Any] = {"turns_k10": turns, "workloads": {}}
    per_rep: dict[str, list[float]] = {label: [] for label, *_ in WORKLOADS}
    # Repetitions interleave every workload and the baseline, so drift hits all alike.
    for _ in range(repeats):
        base_rates += _rates(lambda: baseline(10, turns), 1)
        for label, k, history, conversation in WORKLOADS:
            count = max(3, turns * 10 // k)
            per_rep[label] += _rates(
                lambda k=k, history=history, conversation=conversation, count=count: run_turns(
                    k, count, history, conversation
                ),
                1,
            )
    results["baseline_steps_per_s"] = Stat.of(base_rates).as_dict()
    for label, k, history, _conversation in WORKLOADS:
        rates = per_rep[label]
        results["workloads"][label] = {
            "k": k,
            "history": history,
            "steps_per_s": Stat.of(rates).as_dict(),
            "turns_per_s": Stat.of([r / steps_per_turn(k) for r in rates]).as_dict(),
            "us_per_step": Stat.of([1e6 / r for r in rates]).as_dict(),
            "runner_over_bare_time": Stat.of([b / r for b, r in zip(base_rates, rates, strict=True)]).as_dict(),
        }
    short = per_rep["W K=10, 10 prior (explicit)"]
    for label in ("W K=10, 500 prior (explicit)", "W K=10, 500 prior (conversation, window 500)"):
        results["workloads"][label]["time_vs_10_prior"] = Stat.of(
            [s / r for s, r in zip(short, per_rep[label], strict=True)]
        ).as_dict()
    return results


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=None, help="turns of K=10 per repetition (others scale)")


def main() -> None:
    args = arguments(__doc__, _extra)
    turns = args.turns or (50 if args.quick else 300)
    log("in-memory engine")
    results = measure(max(3, args.repeats), turns)
    write_results(args.json, results)
    base = results["baseline_steps_per_s"]
    print(
        f"baseline (model + tool, no runner): {base['median']:,.0f} steps/s (min {base['min']:,.0f}, max {base['max']:,.0f})"
    )
    print("| workload | steps/s median | min | max | turns/s | us/step | runner/baseline time |")
    print("|---|---|---|---|---|---|---|")
    for label, entry in results["workloads"].items():
        rate = entry["steps_per_s"]
        print(
            f"| {label} | {rate['median']:,.0f} | {rate['min']:,.0f} | {rate['max']:,.0f} "
            f"| {entry['turns_per_s']['median']:,.1f} | {entry['us_per_step']['median']:.0f} "
            f"| {entry['runner_over_bare_time']['median']:.1f}x |"
        )
    ratio = results["workloads"]["W K=10, 500 prior (explicit)"]["time_vs_10_prior"]["median"]
    print(f"\nper-step time at 500 vs 10 prior messages: {ratio:.2f}x (flat in history means close to 1)")


if __name__ == "__main__":
    main()
