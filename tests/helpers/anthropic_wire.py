"""Anthropic Messages API bodies and stream events, as the API reference documents them."""

from __future__ import annotations

from typing import Any

THINKING = {
    "type": "thinking",
    "thinking": "The user wants the weather; call the tool.",
    "signature": "EqQBCgIYAhIM1gbcDa9GJwZAaB3iGgxk",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"}


def message(
    *blocks: dict[str, Any],
    stop_reason: str = "end_turn",
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": list(blocks),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 12, "output_tokens": 6},
    }


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def error(kind: str, detail: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": detail}}


def stream(*blocks: list[tuple[str, Any]], usage: dict[str, int] | None = None, stop: bool = True) -> list[Any]:
    """The events of a streamed message whose content blocks are given as lists of events."""
    start = message(usage={"input_tokens": 20, "output_tokens": 1, **(usage or {})})
    start["content"], start["stop_reason"] = [], None
    events: list[Any] = [("message_start", {"type": "message_start", "message": start}), ("ping", {"type": "ping"})]
    for block in blocks:
        events.extend(block)
    if stop:
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
        delta["usage"] = {"output_tokens": 15}
        events += [("message_delta", delta), ("message_stop", {"type": "message_stop"})]
    return events


def streamed_block(index: int, start: dict[str, Any], *deltas: dict[str, Any]) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
    ]
    events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events
