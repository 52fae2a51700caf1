"""Provider parts of an answer: kept verbatim through JSON, left out of what a page or another provider sees."""

from __future__ import annotations

import pytest

from agent_runner import AiMessage, ProviderPart, ToolCall, Usage
from agent_runner.messages import AnyMessageAdapter, ModelMessagesAdapter
from workers.views import message_view

THINKING = {"type": "thinking", "thinking": "Check the weather first.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}


def test_provider_parts_survive_the_json_round_trip_unchanged() -> None:
    # Given an answer carrying a signed thinking block and a reasoning item
    message = AiMessage(
        content=None,
        tool_calls=[ToolCall("toolu_1", "weather", {"city": "Paris"})],
        provider_parts=[
            ProviderPart("anthropic", THINKING),
            ProviderPart("openai_responses", {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAA=="}),
        ],
    )
    # When it goes through JSON as snapshots and chat memories store it
    loaded = ModelMessagesAdapter.validate_json(ModelMessagesAdapter.dump_json([message]))[0]
    # Then every part is back, byte for byte, and each provider finds its own
    assert loaded == message
    assert isinstance(loaded, AiMessage)
    assert loaded.parts_of("anthropic") == [THINKING]
    assert loaded.parts_of("gemini") == []


def test_an_answer_without_provider_parts_serializes_as_before() -> None:
    message = AiMessage("hello", id="m1")
    assert message.model_dump(mode="json") == {"id": "m1", "role": "assistant", "content": "hello", "tool_calls": []}
    assert AnyMessageAdapter.validate_python(message.model_dump(mode="json")) == message


def test_the_page_view_of_a_message_leaves_provider_parts_out() -> None:
    message = AiMessage("hi", provider_parts=[ProviderPart("anthropic", THINKING)])
    view = message_view(lambda call: call.arguments, message)
    assert "provider_parts" not in view
    assert view["content"] == "hi"


def test_usage_detail_counts_add_up_and_are_left_out_of_the_json_while_zero() -> None:
    first = Usage(100, 10, cache_read_tokens=80, reasoning_tokens=4)
    second = Usage(50, 5, cache_write_tokens=40)
    total = first + second
    assert (total.input_tokens, total.cache_read_tokens, total.cache_write_tokens, total.reasoning_tokens) == (
        150,
        80,
        40,
        4,
    )
    assert Usage(1, 2).model_dump() == {"input_tokens": 1, "output_tokens": 2, "cost": 0.0}
    assert Usage.model_validate(total.model_dump(mode="json")) == total


def test_history_a_caller_gives_is_refused_when_its_provider_parts_are_over_the_limits() -> None:
    from agent_runner import InputLimitError, InputLimits
    from agent_runner.limits import check_message

    limits = InputLimits(max_message_bytes=1024)
    check_message(limits, AiMessage("ok", provider_parts=[ProviderPart("anthropic", THINKING)]), "history[0]")
    huge = AiMessage("ok", provider_parts=[ProviderPart("anthropic", {**THINKING, "thinking": "x" * 2000})])
    with pytest.raises(InputLimitError, match=r"history\[0\]\.provider_parts\[0\]\.data"):
        check_message(limits, huge, "history[0]")
