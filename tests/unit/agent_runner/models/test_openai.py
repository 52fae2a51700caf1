"""The OpenAI-compatible adapter against a real HTTP server speaking the chat-completions wire format.

The server runs on 127.0.0.1 in a thread, answers each POST with the next scripted reply
and records every request, so the tests see exactly what the SDK put on the wire.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import openai
import pytest

from agent_runner.errors import AgentRunnerError, DefinitionError, RecoverableError
from agent_runner.limits import MIB, InputLimits
from agent_runner.messages import AiMessage, ModelMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from agent_runner.models import ChatRequest, ToolSpec
from agent_runner.models.openai import (
    INVALID_ARGUMENTS_KEY,
    ModelAPIError,
    OpenAIChatModel,
    parse_retry_after,
    parse_tool_arguments,
)
from tests.helpers.fake_openai import FakeChatServer, Reply, completion

ModelFactory = Callable[..., OpenAIChatModel]


@pytest.fixture
def make_model(server: FakeChatServer, closing: Callable[[OpenAIChatModel], OpenAIChatModel]) -> ModelFactory:
    """Build models pointed at the server; all are closed before the server stops."""

    def make(model: str = "m", **kwargs: Any) -> OpenAIChatModel:
        kwargs.setdefault("base_url", server.base_url)
        kwargs.setdefault("api_key", "k")
        return closing(OpenAIChatModel(model, **kwargs))

    return make


# ---------------------------------------------------------------------------
# Wire-format builders
# ---------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def tool_delta(
    index: int, call_id: str | None = None, name: str | None = None, arguments: str | None = None
) -> dict[str, Any]:
    piece: dict[str, Any] = {"index": index}
    if call_id is not None:
        piece["id"] = call_id
        piece["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        piece["function"] = function
    return {"tool_calls": [piece]}


def api_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def call(call_id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def result(call_id: str, name: str, content: str) -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, tool_name=name, content=content)


def ask(text: str = "hi", **kwargs: Any) -> ChatRequest:
    return ChatRequest(messages=[UserMessage(content=text)], **kwargs)


LOOKUP = ToolSpec(
    name="lookup_order",
    description="Find an order by number.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)


# ---------------------------------------------------------------------------
# Plain completions
# ---------------------------------------------------------------------------


def test_plain_completion_returns_the_text_and_the_usage(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a server that answers with text
    server.add(Reply(body=completion("Hello there.", usage=(12, 3))))
    # When the model is asked
    response = make_model().generate(ask())
    # Then the answer is an AiMessage without tool calls and the tokens are mapped
    assert response.message.content == "Hello there."
    assert response.message.tool_calls == []
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.cost) == (12, 3, 0.0)
    assert server.requests[0].path == "/v1/chat/completions"
    assert server.requests[0].headers["authorization"] == "Bearer k"


def test_price_turns_tokens_into_cost(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(body=completion("ok", usage=(1_000, 2_000))))
    response = make_model(price=(2.0, 10.0)).generate(ask())
    assert response.usage.cost == pytest.approx((1_000 * 2.0 + 2_000 * 10.0) / 1_000_000)


def test_missing_usage_counts_as_zero(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(body=completion("ok", usage=None)))
    assert make_model().generate(ask()).usage.total_tokens == 0


def test_request_body_maps_messages_tools_and_settings(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a history with every message kind, one tool and two settings
    server.add(Reply(body=completion("done")))
    history: list[ModelMessage] = [
        SystemMessage(content="Be brief."),
        UserMessage(content="Where is order 1001?"),
        AiMessage(
            content="Let me check.", tool_calls=[call("call_1", "lookup_order", {"order_id": "1001", "tags": ["é"]})]
        ),
        result("call_1", "lookup_order", "shipped"),
        AiMessage(content="It has shipped."),
        UserMessage(content="Thanks"),
    ]
    # When the model is called
    make_model("gpt-test", temperature=0.2, max_tokens=64).generate(ChatRequest(messages=history, tools=[LOOKUP]))
    # Then the wire body holds the mapped messages, the tool and the settings
    body = server.requests[0].body
    assert body["model"] == "gpt-test"
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 64
    assert "stream_options" not in body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is order 1001?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id": "1001", "tags": ["é"]}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
        {"role": "assistant", "content": "It has shipped."},
        {"role": "user", "content": "Thanks"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "Find an order by number.",
                "parameters": LOOKUP.parameters,
            },
        }
    ]


def test_assistant_message_with_only_tool_calls_sends_null_content(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    server.add(Reply(body=completion("ok")))
    history: list[ModelMessage] = [
        UserMessage(content="x"),
        AiMessage(tool_calls=[call("c", "t", {})]),
        result("c", "t", "r"),
    ]
    make_model().generate(ChatRequest(messages=history))
    assistant = server.requests[0].body["messages"][1]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["function"]["arguments"] == "{}"


def test_request_without_tools_leaves_tools_out(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(body=completion("ok")))
    make_model().generate(ask())
    assert "tools" not in server.requests[0].body


def test_settings_the_adapter_fills_itself_are_refused() -> None:
    with pytest.raises(DefinitionError, match="messages"):
        OpenAIChatModel("m", api_key="k", messages=[])


# ---------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------


def test_tool_call_response_is_parsed(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a response with two tool calls and no text
    server.add(
        Reply(
            body=completion(
                None,
                [("call_a", "lookup_order", '{"order_id": "1001"}'), ("call_b", "list_orders", "")],
            )
        )
    )
    # When the model is asked
    message = make_model().generate(ask(tools=[LOOKUP])).message
    # Then both calls come back in order with parsed arguments (empty text means no arguments)
    assert message.content is None
    assert message.tool_calls == [
        call("call_a", "lookup_order", {"order_id": "1001"}),
        call("call_b", "list_orders", {}),
    ]


def test_malformed_tool_arguments_are_kept_for_the_model_to_correct(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    # Given a model that produced broken JSON for one call and a JSON list for another
    server.add(
        Reply(
            body=completion(None, [("call_a", "lookup_order", '{"order_id": "10'), ("call_b", "lookup_order", "[1]")])
        )
    )
    # When the response is read
    model = make_model()
    message = model.generate(ask(tools=[LOOKUP])).message
    # Then nothing raises; each call carries the raw text and the reason under the reserved key
    broken, listed = message.tool_calls
    assert broken.id == "call_a"
    assert list(broken.arguments) == [INVALID_ARGUMENTS_KEY]
    assert broken.arguments[INVALID_ARGUMENTS_KEY]["raw"] == '{"order_id": "10'
    assert broken.arguments[INVALID_ARGUMENTS_KEY]["error"].startswith("not valid JSON: Unterminated string")
    assert listed.arguments[INVALID_ARGUMENTS_KEY] == {"raw": "[1]", "error": "a JSON object was expected, got list"}
    # And when that history goes back to the server, the arguments are still valid JSON
    server.add(Reply(body=completion("sorry")))
    model.generate(ChatRequest(messages=[UserMessage(content="x"), message, result("call_a", "lookup_order", "bad")]))
    sent = server.requests[1].body["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent) == broken.arguments


def test_tool_call_without_an_id_gets_one(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(body=completion(None, [("", "lookup_order", '{"order_id": "1"}')])))
    call = make_model().generate(ask()).message.tool_calls[0]
    assert call.id.startswith("call_") and len(call.id) > len("call_")


def test_hostile_answers_are_bounded_and_storable(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a server whose answer is 2 MB of text with a lone surrogate and a NUL, a 10 MB
    # argument, JSON 5000 levels deep, and a call whose id and name are 1 MB each
    huge = json.dumps({"order_id": "1" * 10_000_000})
    deep = "[" * 5000 + "]" * 5000
    text = "\ud800\u0000" + "x" * 2_000_000
    calls = [("call_a", "lookup_order", huge), ("call_b", "lookup_order", deep), ("i" * MIB, "n" * MIB, "{}")]
    server.add(Reply(body=completion(text, calls)))

    # When the response is read
    message = make_model().generate(ask(tools=[LOOKUP])).message

    # Then nothing raised, and nothing in the message is big or unstorable
    big, nested, odd = message.tool_calls
    assert f"{len(huge)} bytes, over the limit of 262144 bytes" in big.arguments[INVALID_ARGUMENTS_KEY]["error"]
    assert len(big.arguments[INVALID_ARGUMENTS_KEY]["raw"]) < 1000
    assert "nested" in nested.arguments[INVALID_ARGUMENTS_KEY]["error"]
    assert odd.id.startswith("call_") and len(odd.id) < 64 and len(odd.name) < 200
    assert message.content is not None and message.content.startswith("\ufffd\ufffdx")
    assert len(message.content.encode("utf-8")) <= MIB and message.content.endswith("bytes]")
    json.dumps(message.model_dump()).encode("utf-8")  # encodable as UTF-8 JSON, as the stores write it


def test_the_limits_of_the_adapter_can_be_raised(server: FakeChatServer, make_model: ModelFactory) -> None:
    arguments = json.dumps({"order_id": "1" * 300_000})
    server.add(Reply(body=completion(None, [("call_a", "lookup_order", arguments)])))
    model = make_model(limits=InputLimits(max_tool_arguments_bytes=MIB))
    assert model.generate(ask(tools=[LOOKUP])).message.tool_calls[0].arguments == {"order_id": "1" * 300_000}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("  ", {}),
        ("null", {INVALID_ARGUMENTS_KEY: {"raw": "null", "error": "a JSON object was expected, got NoneType"}}),
        ("[" * 1000, {INVALID_ARGUMENTS_KEY: {"raw": "[" * 1000, "error": "nested more than 64 levels deep"}}),
    ],
)
def test_parse_tool_arguments(text: str, expected: dict[str, Any]) -> None:
    assert parse_tool_arguments(text) == expected


# ---------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------


def test_streaming_passes_text_deltas_in_order_and_returns_the_whole_answer(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    # Given a server streaming three text pieces and then usage
    server.add(
        Reply(
            sse=[
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hel"}),
                chunk({"content": "lo "}),
                chunk({"content": "world"}),
                chunk({}, finish_reason="stop"),
                usage_chunk(9, 4),
            ]
        )
    )
    deltas: list[str] = []
    # When a streaming model is asked with a delta callback
    response = make_model(stream=True).generate(ask(on_delta=deltas.append))
    # Then every non-empty delta arrived in order and the response holds the joined text
    assert deltas == ["Hel", "lo ", "world"]
    assert response.message.content == "Hello world"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 4)
    body = server.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_streaming_assembles_tool_calls_split_across_chunks(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given two tool calls whose pieces are split and interleaved by index
    server.add(
        Reply(
            sse=[
                chunk({"role": "assistant", "content": "Checking."}),
                chunk(tool_delta(0, "call_a", "lookup_order", "")),
                chunk(tool_delta(0, arguments='{"order_')),
                chunk(tool_delta(1, "call_b", "lookup_order", '{"order_id"')),
                chunk(tool_delta(0, arguments='id": "1001"}')),
                # Some servers repeat the id and name in later pieces; they must not be appended.
                chunk(tool_delta(1, "call_b", "lookup_order", ': "1002"}')),
                chunk({}, finish_reason="tool_calls"),
                usage_chunk(20, 15),
            ]
        )
    )
    # When the stream is read without a delta callback
    response = make_model(stream=True).generate(ask(tools=[LOOKUP]))
    # Then the calls are whole, in index order, with parsed arguments
    assert response.message.content == "Checking."
    assert response.message.tool_calls == [
        call("call_a", "lookup_order", {"order_id": "1001"}),
        call("call_b", "lookup_order", {"order_id": "1002"}),
    ]
    assert response.usage.total_tokens == 35


def test_streamed_malformed_arguments_do_not_raise(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(
        Reply(
            sse=[
                chunk(tool_delta(0, "call_a", "lookup_order", '{"order_id": ')),
                chunk({}, finish_reason="length"),
                usage_chunk(1, 1),
            ]
        )
    )
    call = make_model(stream=True).generate(ask()).message.tool_calls[0]
    assert call.arguments[INVALID_ARGUMENTS_KEY]["raw"] == '{"order_id": '


def test_error_event_inside_a_stream_is_mapped(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given streams that break off with a transient and with a permanent error event
    server.add(
        Reply(sse=[chunk({"content": "Hel"}), api_error("The server had an error", "server_error")]),
        Reply(sse=[chunk({"content": "Hel"}), api_error("Bad things", "invalid_request_error")]),
    )
    model = make_model(stream=True)
    # Then the first is worth a retry and the second is not
    with pytest.raises(RecoverableError, match="The server had an error"):
        model.generate(ask())
    with pytest.raises(ModelAPIError, match="Bad things") as caught:
        model.generate(ask())
    assert caught.value.status_code is None


def test_a_rate_limit_error_event_inside_a_stream_is_marked_rate_limited(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    server.add(Reply(sse=[chunk({"content": "Hel"}), api_error("Rate limit reached", "rate_limit_error")]))
    with pytest.raises(RecoverableError, match="Rate limit reached") as caught:
        make_model(stream=True).generate(ask())
    assert caught.value.rate_limited is True


def test_stream_cut_off_before_a_finish_reason_is_recoverable(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a server whose stream stops mid-answer (no finish reason, no [DONE])
    server.add(Reply(sse=[chunk({"content": "The order has"})], done=False))
    # Then the partial answer is not returned as if it were complete
    with pytest.raises(RecoverableError, match="ended the stream before finishing"):
        make_model(stream=True).generate(ask())


def test_unreadable_chunk_in_a_stream_is_deterministic(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(sse=[chunk({"content": "Hel"}), "{not json"]))
    with pytest.raises(ModelAPIError, match="not a chat completion"):
        make_model(stream=True).generate(ask())


def test_error_raised_by_on_delta_reaches_the_caller_unchanged(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    # Given a delta callback that fails
    server.add(Reply(sse=[chunk({"content": "Hel"}), chunk({"content": "lo"}, finish_reason="stop")]))

    def explode(text: str) -> None:
        raise ValueError(f"listener failed on {text!r}")

    # Then its own error comes out, not one blamed on the server
    with pytest.raises(ValueError, match="listener failed on 'Hel'"):
        make_model(stream=True).generate(ask(on_delta=explode))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_body_that_is_not_a_chat_completion_is_deterministic(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a base_url that serves a web page instead of the API
    server.add(Reply(body=b"<html>Welcome</html>"))
    with pytest.raises(ModelAPIError, match="not a chat completion.*check base_url") as caught:
        make_model().generate(ask())
    assert caught.value.status_code is None


def test_completion_without_choices_is_deterministic(server: FakeChatServer, make_model: ModelFactory) -> None:
    body = completion("x")
    body["choices"] = []
    server.add(Reply(body=body))
    with pytest.raises(ModelAPIError, match="without any choice"):
        make_model().generate(ask())


def test_429_with_retry_after_seconds_is_recoverable(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a rate-limited server asking for 7 seconds
    server.add(Reply(429, api_error("Rate limit reached", "rate_limit_error"), headers={"Retry-After": "7"}))
    # When the model is called
    with pytest.raises(RecoverableError) as caught:
        make_model().generate(ask())
    # Then the error is recoverable, carries the wait and chains the SDK error
    assert caught.value.retry_after == 7.0
    assert caught.value.retryable is True
    assert caught.value.rate_limited is True  # pauses a limited key for every process
    assert "HTTP 429" in str(caught.value) and "Rate limit reached" in str(caught.value)
    assert isinstance(caught.value.__cause__, openai.RateLimitError)
    assert len(server.requests) == 1


def test_429_with_retry_after_date_is_recoverable(server: FakeChatServer, make_model: ModelFactory) -> None:
    later = datetime.now(UTC) + timedelta(seconds=120)
    server.add(Reply(429, api_error("slow down"), headers={"Retry-After": format_datetime(later, usegmt=True)}))
    with pytest.raises(RecoverableError) as caught:
        make_model().generate(ask())
    assert caught.value.retry_after is not None
    assert 100 <= caught.value.retry_after <= 120


def test_503_is_recoverable_and_sent_exactly_once(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given an overloaded server (the SDK would retry 503 by itself if its retries were on)
    server.add(Reply(503, api_error("overloaded", "server_error")), Reply(body=completion("late")))
    # When the model is called
    with pytest.raises(RecoverableError) as caught:
        make_model().generate(ask())
    # Then one HTTP request was made and the runner decides about the retry
    assert len(server.requests) == 1
    assert caught.value.retry_after is None and caught.value.rate_limited is False
    assert isinstance(caught.value.__cause__, openai.InternalServerError)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_deterministic(server: FakeChatServer, make_model: ModelFactory, status: int) -> None:
    server.add(Reply(status, api_error(f"refused with {status}")))
    with pytest.raises(ModelAPIError) as caught:
        make_model().generate(ask())
    error = caught.value
    assert not isinstance(error, RecoverableError)
    assert isinstance(error, AgentRunnerError) and error.retryable is False
    assert error.status_code == status
    assert f"HTTP {status}: refused with {status}" in str(error)
    assert isinstance(error.__cause__, openai.APIStatusError)
    assert len(server.requests) == 1


def test_api_key_never_appears_in_error_messages(server: FakeChatServer, make_model: ModelFactory) -> None:
    # Given a proxy that echoes the key it rejected
    secret = "sk-very-secret-key-1234"
    server.add(Reply(401, api_error(f"Incorrect API key provided: {secret}")))
    with pytest.raises(ModelAPIError) as caught:
        make_model(api_key=secret).generate(ask())
    assert secret not in str(caught.value)
    assert "***" in str(caught.value)
    assert secret not in repr(make_model(api_key=secret))


def test_timeout_is_recoverable(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(body=completion("too late"), delay=5.0))
    with pytest.raises(RecoverableError, match="did not answer in time") as caught:
        make_model(timeout=0.3).generate(ask())
    assert isinstance(caught.value.__cause__, openai.APITimeoutError)


def test_unreachable_server_is_recoverable() -> None:
    # Given a port nobody listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k") as model:
        with pytest.raises(RecoverableError, match="could not be reached") as caught:
            model.generate(ask())
    assert isinstance(caught.value.__cause__, openai.APIConnectionError)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after": "Wed, 01 Jan 2025 00:01:00 GMT"}, 60.0),
        ({"retry-after": "Tue, 31 Dec 2024 23:00:00 GMT"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-3"}, None),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=datetime(2025, 1, 1, tzinfo=UTC)) == expected


# ---------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------


def test_injected_client_is_used_without_sdk_retries_and_left_open(server: FakeChatServer) -> None:
    # Given a caller-owned client with the SDK's default retries
    with openai.OpenAI(api_key="k", base_url=server.base_url) as client:
        server.add(Reply(503, api_error("overloaded", "server_error")))
        model = OpenAIChatModel("m", client=client)
        # When a 503 comes back
        with pytest.raises(RecoverableError):
            model.generate(ask())
        # Then there was no SDK retry, and closing the model leaves the caller's client usable
        assert len(server.requests) == 1
        model.close()
        assert not client.is_closed()


def test_client_and_connection_arguments_are_exclusive() -> None:
    with openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1") as client:
        with pytest.raises(DefinitionError, match="base_url"):
            OpenAIChatModel("m", base_url="http://elsewhere/v1", client=client)


def test_unknown_settings_are_refused_up_front() -> None:
    with pytest.raises(DefinitionError, match=r"unknown settings \['top_k'\].*extra_body"):
        OpenAIChatModel("m", api_key="k", top_k=3)


def test_extra_body_reaches_the_server(server: FakeChatServer, make_model: ModelFactory) -> None:
    server.add(Reply(body=completion("ok")))
    make_model(extra_body={"top_k": 3}, tool_choice="auto").generate(ask(tools=[LOOKUP]))
    assert server.requests[0].body["top_k"] == 3
    assert server.requests[0].body["tool_choice"] == "auto"


@pytest.mark.parametrize("price", [(1.0,), (-1.0, 2.0)])
def test_bad_price_is_refused(price: tuple[float, ...]) -> None:
    with pytest.raises(DefinitionError, match="price"):
        OpenAIChatModel("m", api_key="k", price=price)  # type: ignore[arg-type]


def test_missing_api_key_is_a_definition_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(DefinitionError, match="api_key"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1")


def test_core_imports_without_the_openai_sdk() -> None:
    # Given an interpreter where `import openai` fails
    code = (
        "import sys\n"
        "sys.modules['openai'] = None\n"
        "import agent_runner.models, agent_runner.agent, agent_runner.tools, agent_runner.errors\n"
        "try:\n"
        "    import agent_runner.models.openai\n"
        "except ImportError:\n"
        "    print('adapter unavailable')\n"
    )
    # Then the core imports and only the adapter needs the SDK
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "adapter unavailable"


# ---------------------------------------------------------------------------
# Through the runner
# ---------------------------------------------------------------------------


def test_tool_call_round_trip_through_the_runner_completes(server: FakeChatServer, make_model: ModelFactory) -> None:
    from agent_runner import Agent, AgentRunner, AgentTurnStatus, tool

    executed: list[str] = []

    @tool
    def lookup_order(order_id: str) -> str:
        """Find an order by number."""
        executed.append(order_id)
        return f"order {order_id} has shipped"

    # Given a model that first calls the tool and then answers
    server.add(
        Reply(body=completion(None, [("call_1", "lookup_order", '{"order_id": "1001"}')], usage=(30, 10))),
        Reply(body=completion("Order 1001 has shipped.", usage=(50, 8))),
    )
    agent = Agent(id="a", instructions="Be brief.", chat_model=make_model(), tools=[lookup_order])
    # When a turn runs
    turn = AgentRunner().run(agent, "Where is order 1001?")
    # Then the tool ran once, the turn completed and the usage adds up
    assert turn.status == AgentTurnStatus.COMPLETED
    assert executed == ["1001"]
    assert turn.final_output == "Order 1001 has shipped."
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (80, 18)
    first, second = (request.body for request in server.requests)
    assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    assert first["tools"][0]["function"]["name"] == "lookup_order"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "order 1001 has shipped"}


def test_malformed_arguments_through_the_runner_become_an_error_tool_message(
    server: FakeChatServer, make_model: ModelFactory
) -> None:
    from agent_runner import Agent, AgentRunner, AgentTurnStatus, tool

    executed: list[str] = []

    @tool
    def lookup_order(order_id: str) -> str:
        """Find an order by number."""
        executed.append(order_id)
        return "shipped"

    # Given a model whose first call has broken arguments and which then gives up
    server.add(
        Reply(body=completion(None, [("call_1", "lookup_order", '{"order_id": 10')])),
        Reply(body=completion("I could not look that up.")),
    )
    agent = Agent(id="a", chat_model=make_model(), tools=[lookup_order])
    # When a turn runs
    turn = AgentRunner().run(agent, "Where is order 10?")
    # Then the tool never ran and the model was told about the bad call
    assert turn.status == AgentTurnStatus.COMPLETED
    assert executed == []
    reply = server.requests[1].body["messages"][-1]
    assert reply["role"] == "tool" and reply["tool_call_id"] == "call_1"
    assert reply["content"]


def test_streaming_through_the_runner_emits_model_deltas(server: FakeChatServer, make_model: ModelFactory) -> None:
    from agent_runner import Agent, AgentEventType, AgentRunner, AgentTurnStatus

    server.add(
        Reply(sse=[chunk({"content": "Hel"}), chunk({"content": "lo"}, finish_reason="stop"), usage_chunk(3, 2)])
    )
    runner = AgentRunner()
    events: list[Any] = []
    runner.add_event_listener(events.append)
    turn = runner.run(Agent(id="a", chat_model=make_model(stream=True)), "hi")
    assert turn.status == AgentTurnStatus.COMPLETED
    assert turn.final_output == "Hello"
    deltas = [event.data for event in events if event.type == AgentEventType.MODEL_DELTA]
    assert len(deltas) == 2
    assert "Hel" in deltas[0].values() and "lo" in deltas[1].values()


def test_503_through_the_runner_schedules_a_retry(server: FakeChatServer, make_model: ModelFactory) -> None:
    from agent_runner import Agent, AgentRunner, AgentTurnStatus

    # Given a server that is overloaded and asks for 30 seconds
    server.add(Reply(503, api_error("overloaded", "server_error"), headers={"Retry-After": "30"}))
    before = datetime.now(UTC)
    # When a turn runs
    turn = AgentRunner().run(Agent(id="a", chat_model=make_model()), "hi")
    # Then it waits for a retry no sooner than the server asked, after exactly one request
    assert turn.status == AgentTurnStatus.RETRY_SCHEDULED
    assert turn.next_retry_at is not None
    assert turn.next_retry_at >= before + timedelta(seconds=29)
    assert len(server.requests) == 1


def test_400_through_the_runner_fails_the_turn(server: FakeChatServer, make_model: ModelFactory) -> None:
    from agent_runner import Agent, AgentRunner, AgentTurnStatus

    server.add(Reply(400, api_error("model 'm' does not exist")))
    turn = AgentRunner().run(Agent(id="a", chat_model=make_model()), "hi")
    assert turn.status == AgentTurnStatus.FAILED
    assert turn.error is not None and "does not exist" in turn.error
    assert len(server.requests) == 1
