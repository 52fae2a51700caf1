"""Engine overhead per step on the in-memory store, and how it changes with history length.

Workload: one turn = K tool calls, one per model response from a scripted model (no
network), then a final answer (K=10 -> 21 steps). Reported as medians of several
repetitions with min and max, and as ratios against a baseline measured in the same run:
the bare cost of calling the tool and the scripted model directly, with no runner.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

from agent_runner import (
    Agent,
    AgentRunner,
    AiMessage,
    ChatRequest,
    InMemoryAgentTurnStore,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    UserMessage,
    tool,
)
from agent_runner.policy import AgentExecutionPolicy


@tool
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


def _model(k: int) -> ScriptedChatModel:
    def answer(request: ChatRequest) -> AiMessage:
        last = request.messages[-1]  # O(1): the model's cost must not grow with history here
        done = int(last.tool_call_id[1:]) + 1 if isinstance(last, ToolMessage) else 0
        if done >= k:
            return AiMessage(content="all orders shipped")
        return AiMessage(tool_calls=[ToolCall(id=f"w{done}", name="lookup", arguments={"order_id": str(done)})])

    return ScriptedChatModel(answer)


def _history(n: int) -> list[UserMessage | AiMessage]:
    return [UserMessage(f"earlier message {i}") if i % 2 == 0 else AiMessage(content=f"answer {i}") for i in range(n)]


def run_turns(k: int, turns: int, history: int) -> tuple[float, int]:
    """Run `turns` turns of workload W(k); return (seconds, steps)."""
    agent = Agent(id="bench", chat_model=_model(k), tools=[lookup], max_iterations=k + 1)
    runner = AgentRunner(turn_store=InMemoryAgentTurnStore(), policy=AgentExecutionPolicy(max_steps=10 * k + 10))
    prior = _history(history)
    steps = 0
    start = time.perf_counter()
    for _ in range(turns):
        turn = runner.run(agent, "check my orders", history=prior)
        assert turn.status == "COMPLETED", turn.status
        steps += turn.steps
    return time.perf_counter() - start, steps


def baseline(k: int, turns: int) -> tuple[float, int]:
    """The same model and tool calls with no runner: what the workload costs by itself."""
    model = _model(k)
    start = time.perf_counter()
    steps = 0
    for _ in range(turns):
        messages: list = [UserMessage("check my orders")]
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


def _measure(fn: Callable[[], tuple[float, int]], repeats: int) -> tuple[float, float, float]:
    rates = []
    for _ in range(repeats):
        seconds, steps = fn()
        rates.append(steps / seconds)
    return statistics.median(rates), min(rates), max(rates)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    print(f"# step overhead (in-memory store) - Python {platform.python_version()}, {platform.machine()}")
    base = _measure(lambda: baseline(10, args.turns), args.repeats)
    print(f"baseline (model + tool, no runner): {base[0]:,.0f} steps/s (min {base[1]:,.0f}, max {base[2]:,.0f})")
    print("| workload | steps/s median | min | max | turns/s | us/step | runner/baseline time |")
    print("|---|---|---|---|---|---|---|")
    per_step: dict[str, float] = {}
    for label, k, history in [
        ("W K=10", 10, 0),
        ("W K=50", 50, 0),
        ("W K=10 + 10 prior", 10, 10),
        ("W K=10 + 500 prior", 10, 500),
    ]:
        turns = max(5, args.turns * 10 // k) if k > 10 else args.turns
        med, lo, hi = _measure(lambda k=k, history=history, turns=turns: run_turns(k, turns, history), args.repeats)
        per_step[label] = 1e6 / med
        steps_per_turn = 2 * k + 1
        print(
            f"| {label} | {med:,.0f} | {lo:,.0f} | {hi:,.0f} | {med / steps_per_turn:,.1f} | {1e6 / med:.0f} "
            f"| {base[0] / med:.1f}x |"
        )
    ratio = per_step["W K=10 + 500 prior"] / per_step["W K=10 + 10 prior"]
    print(f"\nper-step time at 500 vs 10 prior messages: {ratio:.2f}x (flat in history means close to 1)")


if __name__ == "__main__":
    main()
