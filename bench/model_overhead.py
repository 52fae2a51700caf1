"""The provider adapters' per-call cost against the bare SDK call, in the same run.

Each adapter and its SDK call the same local fake provider (its wire format, one answer
with a reasoning part and a tool call), with the same 12-message history and one tool.
Bare: the SDK's `create` with the request already built, the answer left as the SDK's
object. Adapter: `generate(ChatRequest)`, which builds the request, reads the answer into
an `AiMessage` with its provider parts, and prices the usage from the genai-prices list.
Blocks of calls alternate between the two so that drift of the machine hits both; the
median wall time per call of each is reported, with their ratio, and the median CPU time
of the calling thread (the client's own work: the fake server runs on other threads).

Run: `python bench/model_overhead.py [--quick] [--json PATH]`.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import ROOT, arguments, log, write_results

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from agent_runner import AiMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from agent_runner.models import ChatModel, ChatRequest, ToolSpec
from tests.helpers import anthropic_wire, gemini_wire, responses_wire
from tests.helpers.fake_openai import FakeChatServer, Reply

WEATHER = ToolSpec("weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})


def history() -> list[Any]:
    messages: list[Any] = [SystemMessage("Be brief.")]
    for step in range(5):
        call = ToolCall(f"call_{step}", "weather", {"city": f"City {step}"})
        messages += [UserMessage(f"Weather {step}?"), AiMessage(tool_calls=[call])]
        messages.append(ToolMessage(call.id, "weather", "sunny"))
    return messages[:12]


def anthropic_pair(server: FakeChatServer) -> tuple[ChatModel, Callable[[], Any]]:
    import anthropic

    from agent_runner.models.anthropic import AnthropicChatModel

    model = AnthropicChatModel("claude-sonnet-4-5", api_key="k", base_url=server.root_url)
    client = anthropic.Anthropic(api_key="k", base_url=server.root_url, max_retries=0)
    arguments = model.request_arguments(ChatRequest(history(), [WEATHER]))
    return model, lambda: client.messages.create(stream=False, **arguments)


def responses_pair(server: FakeChatServer) -> tuple[ChatModel, Callable[[], Any]]:
    import openai

    from agent_runner.models.openai import OpenAIResponsesModel

    model = OpenAIResponsesModel("o4-mini", api_key="k", base_url=server.base_url)
    client = openai.OpenAI(api_key="k", base_url=server.base_url, max_retries=0)
    arguments = model.request_arguments(ChatRequest(history(), [WEATHER]))
    return model, lambda: client.responses.create(stream=False, **arguments)


def gemini_pair(server: FakeChatServer) -> tuple[ChatModel, Callable[[], Any]]:
    from google import genai
    from google.genai import types

    from agent_runner.models.gemini import GeminiChatModel

    client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=server.root_url))
    model = GeminiChatModel("gemini-2.5-flash", client=client)
    contents, config = model.request_arguments(ChatRequest(history(), [WEATHER]))
    return model, lambda: client.models.generate_content(model="gemini-2.5-flash", contents=contents, config=config)  # type: ignore[arg-type]


ANSWERS: dict[str, Any] = {
    "anthropic": anthropic_wire.message(
        anthropic_wire.THINKING,
        anthropic_wire.tool_use("toolu_1", "weather", {"city": "Paris"}),
        usage={"input_tokens": 300, "output_tokens": 40, "cache_read_input_tokens": 900},
    ),
    "openai_responses": responses_wire.response(
        responses_wire.REASONING, responses_wire.function_call("call_9", "weather", '{"city": "Paris"}')
    ),
    "gemini": gemini_wire.response(
        gemini_wire.function_call("weather", {"city": "Paris"}, "fc_1", gemini_wire.SIGNATURE),
        usage={"promptTokenCount": 300, "candidatesTokenCount": 20, "thoughtsTokenCount": 40},
    ),
}
PAIRS = {"anthropic": anthropic_pair, "openai_responses": responses_pair, "gemini": gemini_pair}


def measure(provider: str, blocks: int, calls: int) -> dict[str, Any]:
    body = ANSWERS[provider]
    server = FakeChatServer(answer=lambda _: Reply(body=body))
    try:
        model, bare = PAIRS[provider](server)
        request = ChatRequest(history(), [WEATHER])
        for _ in range(5):  # warm both paths (imports, connection setup, price list)
            model.generate(request)
            bare()
        times: dict[str, list[float]] = {"adapter": [], "bare": []}
        cpu: dict[str, list[float]] = {"adapter": [], "bare": []}
        for _ in range(blocks):
            for name, call in (("bare", bare), ("adapter", lambda: model.generate(request))):
                for _ in range(calls):
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    call()
                    cpu[name].append(time.thread_time() - started_cpu)
                    times[name].append(time.perf_counter() - started)
        getattr(model, "close", lambda: None)()
    finally:
        server.close()
    adapter_ms = statistics.median(times["adapter"]) * 1000
    bare_ms = statistics.median(times["bare"]) * 1000
    adapter_cpu_ms = statistics.median(cpu["adapter"]) * 1000
    bare_cpu_ms = statistics.median(cpu["bare"]) * 1000
    return {
        "adapter_ms": adapter_ms,
        "bare_ms": bare_ms,
        "ratio": adapter_ms / bare_ms,
        "adapter_cpu_ms": adapter_cpu_ms,
        "bare_cpu_ms": bare_cpu_ms,
        "cpu_ratio": adapter_cpu_ms / bare_cpu_ms,
        "calls": blocks * calls,
    }


def main() -> None:
    args = arguments(__doc__)
    blocks, calls = (4, 25) if args.quick else (10, 50)
    results = {}
    for provider in PAIRS:
        results[provider] = measure(provider, blocks, calls)
        r = results[provider]
        log(
            f"{provider}: wall {r['adapter_ms']:.3f} ms (adapter) vs {r['bare_ms']:.3f} ms (bare SDK), "
            f"ratio {r['ratio']:.3f}; calling thread's CPU {r['adapter_cpu_ms']:.3f} vs {r['bare_cpu_ms']:.3f} ms, "
            f"ratio {r['cpu_ratio']:.3f} ({r['calls']} calls each)"
        )
    write_results(args.json, results)


if __name__ == "__main__":
    main()
