"""The Anthropic adapter through the official SDK against a local server speaking the Messages API wire format."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent_runner.errors import RecoverableError
from agent_runner.messages import AiMessage, ModelMessage, SystemMessage, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ToolSpec
from agent_runner.models.anthropic import AnthropicChatModel, ModelAPIError
from agent_runner.tools import INVALID_ARGUMENTS_KEY
from tests.helpers import anthropic_wire as wire
from tests.helpers.fake_openai import FakeChatServer, Reply

WEATHER = ToolSpec("weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})


ModelFactory = Callable[..., AnthropicChatModel]


@pytest.fixture
def make_model(server: FakeChatServer, closing: Callable[[AnthropicChatModel], AnthropicChatModel]) -> ModelFactory:
    def make(model: str = "claude-test", **kwargs: Any) -> AnthropicChatModel:
        kwargs.setdefault("base_url", server.root_url)
        kwargs.setdefault("api_key", "sk-ant-test")
        return closing(AnthropicChatModel(model, **kwargs))

    return make


def ask(*messages: ModelMessage, tools: list[ToolSpec] | None = None) -> ChatRequest:
    return ChatRequest([SystemMessage("Be brief."), *messages], tools or [WEATHER])


def test_a_tool_call_with_thinking_is_answered_and_the_signed_thinking_goes_back_verbatim(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    # Given a model that thinks, calls a tool, then answers
    server.add(
        Reply(body=wire.message(wire.THINKING, wire.REDACTED, wire.tool_use("toolu_1", "weather", {"city": "Paris"}))),
        Reply(body=wire.message(wire.text("Sunny in Paris."))),
    )
    model = make_model(thinking={"type": "enabled", "budget_tokens": 2048})
    # When the first call answers with a tool call
    first = model.generate(ask(UserMessage("Weather in Paris?")))
    assert [(c.id, c.name, c.arguments) for c in first.message.tool_calls] == [
        ("toolu_1", "weather", {"city": "Paris"})
    ]
    assert first.message.parts_of("anthropic") == [wire.THINKING, wire.REDACTED]
    # And the tool's result is sent with the history
    result = ToolMessage("toolu_1", "weather", "sunny")
    second = model.generate(ask(UserMessage("Weather in Paris?"), first.message, result))
    # Then the answer is read, and the assistant turn sent back starts with the thinking blocks as received
    assert second.message.content == "Sunny in Paris."
    sent = server.requests[1]
    assert sent.path == "/v1/messages"
    # The key travels as `x-api-key` or, from newer SDKs, as a bearer token
    assert "sk-ant-test" in sent.headers.get("x-api-key", sent.headers.get("authorization", ""))
    assert "anthropic-version" in sent.headers
    assistant = sent.body["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        wire.THINKING,
        wire.REDACTED,
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ]
    assert sent.body["messages"][2]["content"][0]["type"] == "tool_result"
    assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent.body["max_tokens"] == 4096


def test_cache_breakpoints_mark_the_instructions_the_tools_and_the_end_of_the_history(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    usage = {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 40}
    server.add(Reply(body=wire.message(wire.text("ok"), usage=usage)), Reply(body=wire.message(wire.text("ok"))))
    model = make_model("claude-sonnet-4-5")
    response = model.generate(ask(UserMessage("one"), AiMessage("two"), UserMessage("three")))
    body = server.requests[0].body
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][-1]["content"][-1] == {
        "type": "text",
        "text": "three",
        "cache_control": {"type": "ephemeral"},
    }
    assert "cache_control" not in body["messages"][0]["content"][-1]
    # Cache reads and writes are input tokens, counted apart, and priced as the provider bills them
    assert (response.usage.input_tokens, response.usage.cache_read_tokens, response.usage.cache_write_tokens) == (
        945,
        900,
        40,
    )
    assert 0 < response.usage.cost < (945 * 3 + 3 * 15) / 1_000_000
    # Without caching, no breakpoint is sent
    make_model(cache=False).generate(ask(UserMessage("one")))
    assert "cache_control" not in str(server.requests[1].body)


def test_a_streamed_answer_passes_text_deltas_and_keeps_thinking_and_tool_calls(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    thinking = wire.streamed_block(
        0,
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "thinking_delta", "thinking": "The user wants "},
        {"type": "thinking_delta", "thinking": "the weather; call the tool."},
        {"type": "signature_delta", "signature": wire.THINKING["signature"]},
    )
    text = wire.streamed_block(
        1,
        {"type": "text", "text": ""},
        {"type": "text_delta", "text": "Let me "},
        {"type": "text_delta", "text": "check."},
    )
    call = wire.streamed_block(
        2,
        {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}},
        {"type": "input_json_delta", "partial_json": '{"city": '},
        {"type": "input_json_delta", "partial_json": '"Oslo"}'},
    )
    server.add(Reply(sse=wire.stream(thinking, text, call, usage={"cache_read_input_tokens": 7}), done=False))
    deltas: list[str] = []
    response = make_model(stream=True).generate(ChatRequest([UserMessage("Oslo?")], [WEATHER], on_delta=deltas.append))
    assert deltas == ["Let me ", "check."]
    assert response.message.content == "Let me check."
    assert response.message.parts_of("anthropic") == [wire.THINKING]
    assert [(c.id, c.arguments) for c in response.message.tool_calls] == [("toolu_2", {"city": "Oslo"})]
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.cache_read_tokens) == (27, 15, 7)
    assert server.requests[0].body["stream"] is True


def test_malformed_streamed_tool_arguments_are_kept_for_the_model_to_correct(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    call = wire.streamed_block(
        0,
        {"type": "tool_use", "id": "toolu_3", "name": "weather", "input": {}},
        {"type": "input_json_delta", "partial_json": '{"city": "Oslo'},
    )
    server.add(Reply(sse=wire.stream(call), done=False))
    response = make_model(stream=True).generate(ask(UserMessage("Oslo?")))
    (kept,) = response.message.tool_calls
    assert kept.arguments[INVALID_ARGUMENTS_KEY]["raw"] == '{"city": "Oslo'
    # Sent back as an object, which the API accepts, for the model to see what it wrote
    server.add(Reply(body=wire.message(wire.text("sorry"))))
    make_model().generate(ask(UserMessage("Oslo?"), response.message, ToolMessage("toolu_3", "weather", "bad", True)))
    sent = server.requests[1].body["messages"]
    assert sent[1]["content"][0]["input"] == kept.arguments
    assert sent[2]["content"][0]["is_error"] is True


def test_a_rate_limit_is_recoverable_with_the_servers_retry_after(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    server.add(Reply(429, wire.error("rate_limit_error", "Number of requests too high"), headers={"retry-after": "7"}))
    with pytest.raises(RecoverableError) as raised:
        make_model().generate(ask(UserMessage("hi")))
    assert raised.value.retry_after == 7.0
    assert raised.value.rate_limited


@pytest.mark.parametrize("status", [529, 500, 408, 409])
def test_overloaded_and_server_errors_are_recoverable(
    server: FakeChatServer, make_model: ModelFactory, status: int
) -> None:
    server.add(Reply(status, wire.error("overloaded_error", "Overloaded")))
    with pytest.raises(RecoverableError, match=f"HTTP {status}: Overloaded"):
        make_model().generate(ask(UserMessage("hi")))


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_other_statuses_fail_for_good_without_the_key(
    server: FakeChatServer, make_model: ModelFactory, status: int
) -> None:
    server.add(Reply(status, wire.error("invalid_request_error", "bad key sk-ant-test")))
    with pytest.raises(ModelAPIError) as raised:
        make_model().generate(ask(UserMessage("hi")))
    assert raised.value.status_code == status
    assert "sk-ant-test" not in str(raised.value)


def test_a_stream_cut_midway_is_recoverable(server: FakeChatServer, make_model: ModelFactory) -> None:
    text = wire.streamed_block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Half an ans"})
    server.add(Reply(sse=wire.stream(text, stop=False)[:-1], done=False))
    with pytest.raises(RecoverableError, match="ended the stream before finishing"):
        make_model(stream=True).generate(ask(UserMessage("hi")))


def test_an_overloaded_error_event_inside_a_stream_is_recoverable_and_others_are_not(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    start = wire.stream(stop=False)
    server.add(
        Reply(sse=[*start, ("error", wire.error("overloaded_error", "Overloaded"))], done=False),
        Reply(sse=[*start, ("error", wire.error("invalid_request_error", "prompt too long"))], done=False),
    )
    model = make_model(stream=True)
    with pytest.raises(RecoverableError, match="overloaded_error"):
        model.generate(ask(UserMessage("hi")))
    with pytest.raises(ModelAPIError, match="prompt too long"):
        model.generate(ask(UserMessage("hi")))


def test_a_connection_refused_is_recoverable() -> None:
    model = AnthropicChatModel("claude-test", api_key="k", base_url="http://127.0.0.1:9")
    with pytest.raises(RecoverableError, match="could not be reached"):
        model.generate(ask(UserMessage("hi")))
    model.close()


def test_settings_the_adapter_owns_or_the_sdk_does_not_know_are_refused() -> None:
    from agent_runner.errors import DefinitionError

    with pytest.raises(DefinitionError, match="messages"):
        AnthropicChatModel("m", api_key="k", messages=[])
    with pytest.raises(DefinitionError, match="temprature"):
        AnthropicChatModel("m", api_key="k", temprature=0.2)


def test_parts_another_provider_wrote_are_not_sent_and_other_adapters_do_not_send_these(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    from agent_runner.messages import ProviderPart
    from agent_runner.models.openai import OpenAIChatModel
    from tests.helpers.fake_openai import completion

    # Given an answer that carries a reasoning item of the Responses API and a thinking block of Claude
    reasoning = {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAA"}
    answer = AiMessage(
        "Earlier answer.",
        provider_parts=[ProviderPart("openai_responses", reasoning), ProviderPart("anthropic", wire.THINKING)],
    )
    server.add(Reply(body=wire.message(wire.text("ok"))), Reply(body=completion("ok")))
    # When Claude and a chat-completions model each get it in their history
    make_model().generate(ask(UserMessage("hi"), answer, UserMessage("again")))
    chat = OpenAIChatModel("gpt-4o-mini", base_url=server.base_url, api_key="k")
    try:
        chat.generate(ask(UserMessage("hi"), answer, UserMessage("again")))
    finally:
        chat.close()
    # Then Claude gets its own thinking block only, and the chat-completions model gets neither
    claude_body, chat_body = server.requests[0].body, server.requests[1].body
    assert claude_body["messages"][1]["content"] == [wire.THINKING, {"type": "text", "text": "Earlier answer."}]
    assert "gAAA" not in str(claude_body)
    assert chat_body["messages"][2] == {"role": "assistant", "content": "Earlier answer."}
    assert "signature" not in str(chat_body) and "gAAA" not in str(chat_body)


def test_a_streamed_claude_turn_emits_deltas_and_keeps_its_thinking_in_the_snapshot(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    from agent_runner import Agent, AgentEventType, AgentRunner, AgentTurnStatus
    from tests.unit.agent_runner.turn_kit import EventLog

    thinking = wire.streamed_block(
        0,
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "thinking_delta", "thinking": wire.THINKING["thinking"]},
        {"type": "signature_delta", "signature": wire.THINKING["signature"]},
    )
    text = wire.streamed_block(
        1, {"type": "text", "text": ""}, *({"type": "text_delta", "text": t} for t in ("Hel", "lo"))
    )
    server.add(Reply(sse=wire.stream(thinking, text), done=False))
    runner = AgentRunner()
    events = EventLog()
    runner.add_event_listener(events)
    turn = runner.run(Agent(id="claude", chat_model=make_model(stream=True)), "hi")
    assert turn.status is AgentTurnStatus.COMPLETED and turn.final_output == "Hello"
    assert [e.data["delta"] for e in events.of_type(AgentEventType.MODEL_DELTA)] == ["Hel", "lo"]
    answer = turn.messages[-1]
    assert isinstance(answer, AiMessage) and answer.parts_of("anthropic") == [wire.THINKING]
    # The event a page reads carries the text, never the signed thinking
    [response] = events.of_type(AgentEventType.MODEL_RESPONSE)
    assert "signature" not in str(response.data)


def test_the_async_call_reads_the_same_answers_and_sorts_the_same_failures(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    import asyncio

    text = wire.streamed_block(
        1, {"type": "text", "text": ""}, *({"type": "text_delta", "text": t} for t in ("Hi", "!"))
    )
    server.add(
        Reply(body=wire.message(wire.THINKING, wire.tool_use("toolu_9", "weather", {"city": "Rome"}))),
        Reply(sse=wire.stream(text), done=False),
        Reply(529, wire.error("overloaded_error", "Overloaded"), headers={"retry-after": "4"}),
    )
    plain, streaming = make_model(), make_model(stream=True)
    deltas: list[str] = []

    async def calls() -> None:
        try:
            first = await plain.agenerate(ask(UserMessage("Rome?")))
            assert first.message.parts_of("anthropic") == [wire.THINKING]
            assert [(c.id, c.arguments) for c in first.message.tool_calls] == [("toolu_9", {"city": "Rome"})]
            second = await streaming.agenerate(ChatRequest([UserMessage("hi")], on_delta=deltas.append))
            assert second.message.content == "Hi!"
            with pytest.raises(RecoverableError) as raised:
                await plain.agenerate(ask(UserMessage("again")))
            assert raised.value.retry_after == 4.0
        finally:
            await plain.aclose()
            await streaming.aclose()

    asyncio.run(calls())
    assert deltas == ["Hi", "!"]
    assert server.requests[2].body["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
