"""The per-step cost of a turn whose tool is on an MCP server, against one whose Python tool takes as long.

A real MCP server process (`tests.helpers.mcp_server`, streamable HTTP on loopback) offers
`add`. The MCP turn calls it through `MCPToolset` K times, one call per scripted model
response, then answers (2K+1 steps). The Python turn does the same with an `@tool` whose
body is the bare call of the official `mcp` SDK (a fresh connection and one `tools/call`,
as the toolset makes), so both turns wait on the same server equally, whatever the machine's
load, and the difference is what the toolset adds: the listing (cached per process), the
schemas, the argument check, the connection's setup around the SDK, the result's reading.
Blocks of turns alternate between the two so that drift of the machine hits both; the
median wall time per step of each is reported with their ratio, and the median of the bare
calls themselves.

Run: `python bench/mcp_overhead.py [--quick] [--json PATH]`.
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, arguments, log, write_results

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agent_runner import (
    Agent,
    AgentExecutionPolicy,
    AgentRunner,
    AiMessage,
    ChatRequest,
    InMemoryAgentTurnStore,
    ScriptedChatModel,
    ToolCall,
    ToolMessage,
    tool,
)
from agent_runner.mcp import MCPToolset
from tests.helpers.mcp_server import MCPServerProcess

SECTION_TITLE = "## 14. MCP toolsets: the cost of a step against a Python tool as slow"
"""The heading of this section in docs/benchmarks.md."""
GOAL_RATIO = 1.1
"""A step of a turn on an MCP toolset, at most this many times a step whose Python tool takes as long."""
CALLS = 5
"""Tool calls per turn (2 * CALLS + 1 steps)."""


def model(request: ChatRequest) -> AiMessage:
    """Call `add` until CALLS results are in, then answer with the last."""
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    if len(results) >= CALLS:
        return AiMessage(content=f"sum {results[-1].content}")
    return AiMessage(tool_calls=[ToolCall(id=f"c{len(results)}", name="add", arguments={"a": len(results), "b": 1})])


async def _discover(url: str) -> tuple[str, Any]:
    async with Client(url) as client:
        return client.protocol_version, client.session.discover_result


async def _bare_call(url: str, pinned: tuple[str, Any], tls: ssl.SSLContext) -> None:
    # As the toolset does: the protocol version found once is pinned (no probe per call), the
    # TLS context (~90 ms to load) is made once per process, and no listing cache (a listing per call).
    http = httpx2.AsyncClient(verify=tls)
    transport = streamable_http_client(url, http_client=http)
    async with http, Client(transport, mode=pinned[0], prior_discover=pinned[1], cache=None) as client:  # type: ignore[arg-type]
        result = await client.session.call_tool("add", {"a": 1, "b": 2})
        assert not getattr(result, "is_error", False), result


def runners(url: str, bare_calls: list[float]) -> dict[str, tuple[AgentRunner, Agent]]:
    pinned = asyncio.run(_discover(url))
    tls = ssl.create_default_context()

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers (waiting as long as the server's `add` takes: it calls it)."""
        started = time.perf_counter()
        asyncio.run(_bare_call(url, pinned, tls))
        bare_calls.append(time.perf_counter() - started)
        return a + b

    policy = AgentExecutionPolicy(max_steps=4 * CALLS)
    toolset = MCPToolset(url, include=["add"], list_ttl=3600)
    agents = {
        "mcp": Agent(id="mcp", chat_model=ScriptedChatModel(model), tools=[toolset]),
        "python": Agent(id="python", chat_model=ScriptedChatModel(model), tools=[add]),
    }
    return {name: (AgentRunner(turn_store=InMemoryAgentTurnStore(), policy=policy), a) for name, a in agents.items()}


def measure(blocks: int, turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as folder:
        server = MCPServerProcess(Path(folder)).start()
        try:
            bare_calls: list[float] = []
            made = runners(server.url, bare_calls)
            per_step: dict[str, list[float]] = {"mcp": [], "python": []}
            cpu_per_step: dict[str, list[float]] = {"mcp": [], "python": []}
            for runner, agent in made.values():  # warm both (the listing is cached from here on)
                runner.run(agent, "add")
            bare_calls.clear()
            for _ in range(blocks):
                for name, (runner, agent) in made.items():
                    for _ in range(turns):
                        started, started_cpu = time.perf_counter(), time.process_time()
                        turn = runner.run(agent, "add")
                        elapsed, cpu = time.perf_counter() - started, time.process_time() - started_cpu
                        assert turn.final_output == f"sum {CALLS}", turn.error
                        per_step[name].append(elapsed / turn.steps)
                        cpu_per_step[name].append(cpu / turn.steps)
        finally:
            server.stop()
    mcp_ms = statistics.median(per_step["mcp"]) * 1000
    python_ms = statistics.median(per_step["python"]) * 1000
    return {
        "bare_call_ms": statistics.median(bare_calls) * 1000,
        "mcp_step_ms": mcp_ms,
        "python_step_ms": python_ms,
        "ratio": mcp_ms / python_ms,
        "mcp_cpu_step_ms": statistics.median(cpu_per_step["mcp"]) * 1000,
        "python_cpu_step_ms": statistics.median(cpu_per_step["python"]) * 1000,
        "steps_per_turn": 2 * CALLS + 1,
        "turns": blocks * turns,
    }


def goals(data: dict[str, Any] | None) -> list[tuple[str, str, str, bool | None]]:
    """The goal of this section (name, target, measured, met), for the report."""
    ratio = None if data is None else data["ratio"]
    return [
        (
            "MCP toolset: wall time per step / a Python tool as slow",
            f"<= {GOAL_RATIO:g}x",
            "not measured" if ratio is None else f"{ratio:.2f}x",
            None if ratio is None else ratio <= GOAL_RATIO,
        )
    ]


def section(results: dict[str, Any]) -> str:
    """This section of docs/benchmarks.md."""
    r = results
    return "\n".join(
        [
            "A turn of 5 calls of `add` on a local MCP server process (streamable HTTP) through `MCPToolset`, against "
            "the same turn with an `@tool` whose body is the bare `tools/call` of the `mcp` SDK over a fresh "
            "connection (so it takes as long as the server does). Blocks of turns alternate; medians per step (wall, "
            "and the process's CPU, the client's side of each call included) and of the bare calls. "
            "`bench/mcp_overhead.py`.",
            "",
            "| bare SDK call ms | MCP step ms | Python step ms | ratio | MCP CPU/step ms | Python CPU/step ms | turns |",
            "|---|---|---|---|---|---|---|",
            f"| {r['bare_call_ms']:.2f} | {r['mcp_step_ms']:.2f} | {r['python_step_ms']:.2f} | {r['ratio']:.2f}x | "
            f"{r['mcp_cpu_step_ms']:.2f} | {r['python_cpu_step_ms']:.2f} | {r['turns']} each |",
        ]
    )


def main() -> None:
    args = arguments(__doc__)
    blocks, turns = (2, 3) if args.quick else (6, 10)
    results = measure(blocks, turns)
    r = results
    log(
        f"MCP toolset: {r['mcp_step_ms']:.2f} ms per step vs {r['python_step_ms']:.2f} ms with a Python tool making the bare call "
        f"(bare SDK call {r['bare_call_ms']:.2f} ms): ratio {r['ratio']:.3f}; CPU per step "
        f"{r['mcp_cpu_step_ms']:.2f} vs {r['python_cpu_step_ms']:.2f} ms ({r['turns']} turns each)"
    )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
