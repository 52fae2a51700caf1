"""The Gemini adapter through the google-genai SDK against a local server speaking the Gemini API wire format."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google import genai
from google.genai import types

from agent_runner.errors import DefinitionError, RecoverableError
from agent_runner.messages import ModelMessage, SystemMessage, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ToolSpec
from agent_runner.models.gemini import GeminiChatModel, ModelAPIError
from tests.helpers import gemini_wire as wire
from tests.helpers.fake_openai import FakeChatServer, Reply

WEATHER = ToolSpec("weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})
USAGE = {
    "promptTokenCount": 50,
    "candidatesTokenCount": 8,
    "thoughtsTokenCount": 30,
    "cachedContentTokenCount": 40,
    "totalTokenCount": 88,
}


ModelFactory = Callable[..., GeminiChatModel]


@pytest.fixture
def make_model(server: FakeChatServer, closing: Callable[[genai.Client], genai.Client]) -> ModelFactory:
    def make(model: str = "gemini-test", **kwargs: Any) -> GeminiChatModel:
        client = closing(genai.Client(api_key="g-test-key", http_options=types.HttpOptions(base_url=server.root_url)))
        return GeminiChatModel(model, client=client, **kwargs)

    return make


def ask(*messages: ModelMessage) -> ChatRequest:
    return ChatRequest([SystemMessage("Be brief."), *messages], [WEATHER])


def test_function_calls_over_two_steps_send_each_thought_signature_back_on_its_part(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    # Given a thinking model that signs its function call, then answers with signed text
    server.add(
        Reply(
            body=wire.response(wire.function_call("weather", {"city": "Paris"}, signature=wire.SIGNATURE), usage=USAGE)
        ),
        Reply(body=wire.response({"text": "Sunny.", "thoughtSignature": wire.TEXT_SIGNATURE})),
        Reply(body=wire.response({"text": "Bye."})),
    )
    model = make_model(temperature=0.2)
    first = model.generate(ask(UserMessage("Paris?")))
    (call,) = first.message.tool_calls
    assert (call.name, call.arguments) == ("weather", {"city": "Paris"})
    second = model.generate(ask(UserMessage("Paris?"), first.message, ToolMessage(call.id, "weather", "sunny")))
    assert second.message.content == "Sunny."
    # Then the second request carries the call with its signature, and the function's response
    sent = server.requests[1]
    assert sent.path.endswith("/models/gemini-test:generateContent")
    assert sent.body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert sent.body["tools"][0]["functionDeclarations"][0]["name"] == "weather"
    assert sent.body["generationConfig"]["temperature"] == 0.2
    model_turn, response_turn = sent.body["contents"][1:]
    assert model_turn["role"] == "model"
    (signed,) = model_turn["parts"]
    assert signed["thoughtSignature"] == wire.SIGNATURE
    assert signed["functionCall"]["name"] == "weather" and signed["functionCall"]["args"] == {"city": "Paris"}
    assert response_turn["parts"][0]["functionResponse"]["response"] == {"result": "sunny"}
    # And a signed text answer goes back signed too
    model.generate(ask(UserMessage("Paris?"), second.message, UserMessage("Thanks")))
    assert server.requests[2].body["contents"][1]["parts"] == [
        {"text": "Sunny.", "thoughtSignature": wire.TEXT_SIGNATURE}
    ]
    # Usage: thinking tokens are output tokens, cached ones are input tokens
    usage = first.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens, usage.cache_read_tokens) == (
        50,
        38,
        30,
        40,
    )


def test_a_streamed_answer_passes_text_deltas_and_skips_thought_summaries(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    server.add(
        Reply(
            sse=[
                wire.response({"text": "Thinking about it", "thought": True}, finish=None),
                wire.response({"text": "Hello"}, finish=None),
                wire.response({"text": " there"}, usage=USAGE),
            ],
            done=False,
        )
    )
    deltas: list[str] = []
    response = make_model(stream=True).generate(ChatRequest([UserMessage("hi")], on_delta=deltas.append))
    assert deltas == ["Hello", " there"]
    assert response.message.content == "Hello there"
    assert "streamGenerateContent" in server.requests[0].path


def test_a_stream_cut_before_a_finish_reason_is_recoverable(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(sse=[wire.response({"text": "Hel"}, finish=None)], done=False))
    with pytest.raises(RecoverableError, match="ended the stream before finishing"):
        make_model(stream=True).generate(ask(UserMessage("hi")))


def test_a_rate_limit_is_recoverable_with_the_retry_delay_of_the_error_body(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    server.add(
        Reply(429, wire.error(429, "RESOURCE_EXHAUSTED", "Quota exceeded", retry_delay="37s")),
        Reply(429, wire.error(429, "RESOURCE_EXHAUSTED", "Quota exceeded"), headers={"retry-after": "3"}),
        Reply(503, wire.error(503, "UNAVAILABLE", "The model is overloaded")),
    )
    model = make_model()
    with pytest.raises(RecoverableError) as raised:
        model.generate(ask(UserMessage("hi")))
    assert raised.value.retry_after == 37.0 and raised.value.rate_limited
    with pytest.raises(RecoverableError) as raised:
        model.generate(ask(UserMessage("hi")))
    assert raised.value.retry_after == 3.0
    with pytest.raises(RecoverableError, match="HTTP 503"):
        model.generate(ask(UserMessage("hi")))


def test_a_bad_request_fails_for_good(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(400, wire.error(400, "INVALID_ARGUMENT", "Invalid JSON payload")))
    with pytest.raises(ModelAPIError) as raised:
        make_model().generate(ask(UserMessage("hi")))
    assert raised.value.status_code == 400


def test_a_connection_refused_is_recoverable() -> None:
    client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url="http://127.0.0.1:9"))
    with pytest.raises(RecoverableError, match="could not be reached"):
        GeminiChatModel("gemini-test", client=client).generate(ask(UserMessage("hi")))


def test_settings_the_adapter_owns_or_the_config_does_not_know_are_refused() -> None:
    with pytest.raises(DefinitionError, match="tools"):
        GeminiChatModel("gemini-test", api_key="k", tools=[])
    with pytest.raises(DefinitionError, match="temprature"):
        GeminiChatModel("gemini-test", api_key="k", temprature=0.1)


def test_the_async_call_reads_the_same_answers_and_sorts_the_same_failures(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    import asyncio

    server.add(
        Reply(body=wire.response(wire.function_call("weather", {"city": "Oslo"}, "fc_7", wire.SIGNATURE))),
        Reply(sse=[wire.response({"text": "Hi"}, finish=None), wire.response({"text": "!"})], done=False),
        Reply(sse=[wire.response({"text": "Hal"}, finish=None)], done=False),
        Reply(503, wire.error(503, "UNAVAILABLE", "The model is overloaded")),
    )
    plain, streaming = make_model(), make_model(stream=True)
    deltas: list[str] = []

    async def calls() -> None:
        first = await plain.agenerate(ask(UserMessage("Oslo?")))
        assert [(c.id, c.arguments) for c in first.message.tool_calls] == [("fc_7", {"city": "Oslo"})]
        assert first.message.parts_of("gemini") == [{"tool_call_id": "fc_7", "signature": wire.SIGNATURE}]
        second = await streaming.agenerate(ChatRequest([UserMessage("hi")], on_delta=deltas.append))
        assert second.message.content == "Hi!"
        with pytest.raises(RecoverableError, match="ended the stream before finishing"):
            await streaming.agenerate(ask(UserMessage("again")))
        with pytest.raises(RecoverableError, match="HTTP 503"):
            await plain.agenerate(ask(UserMessage("again")))

    asyncio.run(calls())
    assert deltas == ["Hi", "!"]
