"""OpenAI Responses API bodies and stream events, as the API reference documents them."""

from __future__ import annotations

from typing import Any

REASONING = {
    "type": "reasoning",
    "id": "rs_01",
    "summary": [{"type": "summary_text", "text": "Look the weather up."}],
    "encrypted_content": "gAAAAABoQ2V4ZW5jcnlwdGVkLXJlYXNvbmluZw==",
}


def response(
    *output: dict[str, Any], status: str = "completed", usage: dict[str, Any] | None = None, error: Any = None
) -> dict[str, Any]:
    return {
        "id": "resp_01",
        "object": "response",
        "created_at": 1741476542,
        "status": status,
        "error": error,
        "incomplete_details": None,
        "model": "o4-mini",
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage
        or {
            "input_tokens": 40,
            "input_tokens_details": {"cached_tokens": 32},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 12},
            "total_tokens": 60,
        },
    }


def text(value: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_01",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": value, "annotations": []}],
    }


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_01",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def stream(final: dict[str, Any], *deltas: str, end: str | None = "response.completed") -> list[Any]:
    """The events of a streamed response: created, the text deltas, then `end` carrying `final`."""
    created = {**final, "status": "in_progress", "output": []}
    events: list[Any] = [("response.created", {"type": "response.created", "sequence_number": 0, "response": created})]
    for number, delta in enumerate(deltas, start=1):
        event = {
            "type": "response.output_text.delta",
            "sequence_number": number,
            "item_id": "msg_01",
            "output_index": 0,
            "content_index": 0,
            "delta": delta,
        }
        events.append(("response.output_text.delta", event))
    if end is not None:
        events.append((end, {"type": end, "sequence_number": len(deltas) + 1, "response": final}))
    return events
