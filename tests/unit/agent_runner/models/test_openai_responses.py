"""The Responses API adapter through the openai SDK against a local server speaking the Responses wire format."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agent_runner.errors import DefinitionError, RecoverableError
from agent_runner.messages import ModelMessage, SystemMessage, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ToolSpec
from agent_runner.models.openai import ModelAPIError, OpenAIResponsesModel
from agent_runner.operations import OperationPending
from agent_runner.tools import INVALID_ARGUMENTS_KEY
from tests.helpers import responses_wire as wire
from tests.helpers.background_responses import SERVER_ERROR, BackgroundResponses, Outcome
from tests.helpers.fake_openai import FakeChatServer, Reply

WEATHER = ToolSpec("weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})


ModelFactory = Callable[..., OpenAIResponsesModel]


@pytest.fixture
def make_model(server: FakeChatServer, closing: Callable[[OpenAIResponsesModel], OpenAIResponsesModel]) -> ModelFactory:
    def make(model: str = "o4-mini", **kwargs: Any) -> OpenAIResponsesModel:
        kwargs.setdefault("base_url", server.base_url)
        kwargs.setdefault("api_key", "sk-test-key")
        return closing(OpenAIResponsesModel(model, **kwargs))

    return make


def ask(*messages: ModelMessage) -> ChatRequest:
    return ChatRequest([SystemMessage("Be brief."), *messages], [WEATHER])


def test_reasoning_items_are_kept_and_sent_back_verbatim_before_the_calls_they_led_to(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    # Given a reasoning model that calls a tool over two steps, then answers
    server.add(
        Reply(body=wire.response(wire.REASONING, wire.function_call("call_1", "weather", '{"city": "Paris"}'))),
        Reply(body=wire.response(wire.text("Sunny."))),
    )
    model = make_model(reasoning={"effort": "low"})
    first = model.generate(ask(UserMessage("Paris?")))
    assert [(c.id, c.arguments) for c in first.message.tool_calls] == [("call_1", {"city": "Paris"})]
    assert first.message.parts_of("openai_responses") == [wire.REASONING]
    second = model.generate(ask(UserMessage("Paris?"), first.message, ToolMessage("call_1", "weather", "sunny")))
    assert second.message.content == "Sunny."
    # Then the second request carries the reasoning item as received, then the call and its output
    sent = server.requests[1]
    assert sent.path == "/v1/responses"
    assert sent.body["store"] is False
    assert "reasoning.encrypted_content" in sent.body["include"]
    assert sent.body["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Paris?"},
        wire.REASONING,
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    assert sent.body["tools"][0]["name"] == "weather"
    assert sent.body["reasoning"] == {"effort": "low"}
    # And usage holds cached and reasoning tokens
    usage = first.usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens, usage.reasoning_tokens) == (
        40,
        32,
        20,
        12,
    )


def test_a_streamed_response_passes_text_deltas_and_reads_the_completed_response(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    final = wire.response(wire.REASONING, wire.text("Hello there"))
    server.add(Reply(sse=wire.stream(final, "Hello", " there"), done=False))
    deltas: list[str] = []
    response = make_model(stream=True).generate(ChatRequest([UserMessage("hi")], on_delta=deltas.append))
    assert deltas == ["Hello", " there"]
    assert response.message.content == "Hello there"
    assert response.message.parts_of("openai_responses") == [wire.REASONING]
    assert server.requests[0].body["stream"] is True


def test_a_stream_cut_before_the_response_completes_is_recoverable(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    server.add(Reply(sse=wire.stream(wire.response(wire.text("Hel")), "Hel", end=None), done=False))
    with pytest.raises(RecoverableError, match="ended the stream before finishing"):
        make_model(stream=True).generate(ask(UserMessage("hi")))


def test_a_failed_response_is_recoverable_when_its_code_is_transient(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    failed = wire.response(status="failed", error={"code": "server_error", "message": "The server had an error"})
    refused = wire.response(status="failed", error={"code": "invalid_prompt", "message": "Prompt refused"})
    server.add(
        Reply(sse=wire.stream(failed, end="response.failed"), done=False),
        Reply(body=refused),
    )
    model = make_model(stream=True)
    with pytest.raises(RecoverableError, match="The server had an error"):
        model.generate(ask(UserMessage("hi")))
    with pytest.raises(ModelAPIError, match="Prompt refused"):
        make_model().generate(ask(UserMessage("hi")))


def test_malformed_function_arguments_are_kept_for_the_model_to_correct(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    server.add(Reply(body=wire.response(wire.function_call("call_2", "weather", '{"city": '))))
    (call,) = make_model().generate(ask(UserMessage("hi"))).message.tool_calls
    assert call.arguments[INVALID_ARGUMENTS_KEY]["raw"] == '{"city": '


def test_a_rate_limit_is_recoverable_with_the_servers_retry_after(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    body = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    server.add(Reply(429, body, headers={"retry-after-ms": "2500"}), Reply(503, {"error": {"message": "busy"}}))
    model = make_model()
    with pytest.raises(RecoverableError) as raised:
        model.generate(ask(UserMessage("hi")))
    assert raised.value.retry_after == 2.5
    assert raised.value.rate_limited
    with pytest.raises(RecoverableError, match="HTTP 503"):
        model.generate(ask(UserMessage("hi")))


def test_a_bad_request_fails_for_good_without_the_key(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(400, {"error": {"message": "bad key sk-test-key", "type": "invalid_request_error"}}))
    with pytest.raises(ModelAPIError) as raised:
        make_model().generate(ask(UserMessage("hi")))
    assert raised.value.status_code == 400
    assert "sk-test-key" not in str(raised.value)


def test_a_background_response_is_started_once_then_read_by_its_id_until_it_completes(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    responses = BackgroundResponses(Outcome([wire.REASONING, wire.text("Sunny.")], polls=1), Outcome())
    server._answer = responses
    model = make_model(background=True)
    # Starting it answers with the response id instead of the answer
    with pytest.raises(OperationPending) as started:
        model.generate(ask(UserMessage("Paris?")))
    assert started.value.handle == {"response_id": "resp_bg_1"} and started.value.status == "queued"
    [created] = responses.created
    assert created["background"] is True and created["store"] is True
    assert "reasoning.encrypted_content" in created["include"] and "stream" not in created
    # Reading it while it runs asks for another look; once completed it is the answer
    with pytest.raises(OperationPending) as running:
        model.poll_operation(started.value.handle)
    assert running.value.status == "in_progress"
    answer = model.poll_operation(started.value.handle)
    assert answer.message.content == "Sunny." and answer.message.parts_of("openai_responses") == [wire.REASONING]
    assert (answer.usage.input_tokens, answer.usage.output_tokens, answer.usage.reasoning_tokens) == (40, 20, 12)
    assert [r.path for r in server.requests] == ["/v1/responses", *["/v1/responses/resp_bg_1"] * 2]
    assert len(responses.created) == 1 and responses.reads == 2
    # The async call starts one the same way
    with pytest.raises(OperationPending) as started_async:
        asyncio.run(model.agenerate(ask(UserMessage("Lyon?"))))
    assert started_async.value.handle == {"response_id": "resp_bg_2"} and responses.created[1]["background"] is True


def test_a_failed_background_response_is_sorted_as_a_failed_call_and_a_cancel_reaches_the_server(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    denied = {"code": "invalid_prompt", "message": "Invalid prompt."}
    responses = BackgroundResponses(Outcome(polls=0, error=SERVER_ERROR), Outcome(polls=0, error=denied), Outcome())
    server._answer = responses
    model = make_model(background=True)
    handles = []
    for _ in range(3):
        with pytest.raises(OperationPending) as started:
            model.generate(ask(UserMessage("hi")))
        handles.append(started.value.handle)
    with pytest.raises(RecoverableError):
        model.poll_operation(handles[0])
    with pytest.raises(ModelAPIError, match="Invalid prompt"):
        model.poll_operation(handles[1])
    model.cancel_operation(handles[2])
    assert responses.cancels == ["resp_bg_3"]
    with pytest.raises(ModelAPIError, match="cancelled"):
        model.poll_operation(handles[2])
    with pytest.raises(ModelAPIError) as unknown:
        model.poll_operation({"response_id": "resp_gone"})
    assert unknown.value.status_code == 404


def test_background_responses_cannot_stream_or_go_unstored() -> None:
    with pytest.raises(DefinitionError, match="cannot stream"):
        OpenAIResponsesModel("o4-mini", api_key="k", background=True, stream=True)
    with pytest.raises(DefinitionError, match="store=True"):
        OpenAIResponsesModel("o4-mini", api_key="k", background=True, store=False)


def test_settings_the_adapter_owns_or_the_sdk_does_not_know_are_refused() -> None:
    with pytest.raises(DefinitionError, match="input"):
        OpenAIResponsesModel("o4-mini", api_key="k", input=[])
    with pytest.raises(DefinitionError, match="max_tokenz"):
        OpenAIResponsesModel("o4-mini", api_key="k", max_tokenz=5)


def test_the_async_call_reads_the_same_answers_and_sorts_the_same_failures(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    import asyncio

    server.add(
        Reply(body=wire.response(wire.REASONING, wire.function_call("call_5", "weather", '{"city": "Oslo"}'))),
        Reply(sse=wire.stream(wire.response(wire.text("Hi!")), "Hi", "!"), done=False),
        Reply(429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}}, headers={"retry-after": "6"}),
    )
    plain, streaming = make_model(), make_model(stream=True)
    deltas: list[str] = []

    async def calls() -> None:
        try:
            first = await plain.agenerate(ask(UserMessage("Oslo?")))
            assert first.message.parts_of("openai_responses") == [wire.REASONING]
            second = await streaming.agenerate(ChatRequest([UserMessage("hi")], on_delta=deltas.append))
            assert second.message.content == "Hi!"
            with pytest.raises(RecoverableError) as raised:
                await plain.agenerate(ask(UserMessage("again")))
            assert raised.value.retry_after == 6.0 and raised.value.rate_limited
        finally:
            await plain.aclose()
            await streaming.aclose()

    asyncio.run(calls())
    assert deltas == ["Hi", "!"]
