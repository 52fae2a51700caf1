"""Gemini API (`generateContent`) bodies, as the API reference documents them."""

from __future__ import annotations

import base64
from typing import Any

SIGNATURE = base64.b64encode(b"signed-thought-of-step-1").decode()
TEXT_SIGNATURE = base64.b64encode(b"signed-thought-of-the-answer").decode()


def response(
    *parts: dict[str, Any], finish: str | None = "STOP", usage: dict[str, int] | None = None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-2.5-flash", "responseId": "r1"}
    if usage is not None:
        body["usageMetadata"] = usage
    return body


def function_call(
    name: str, args: dict[str, Any], call_id: str | None = None, signature: str | None = None
) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": args}
    if call_id is not None:
        call["id"] = call_id
    part: dict[str, Any] = {"functionCall": call}
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def error(code: int, status: str, message: str, retry_delay: str | None = None) -> dict[str, Any]:
    details = (
        []
        if retry_delay is None
        else [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}]
    )
    return {"error": {"code": code, "message": message, "status": status, "details": details}}
