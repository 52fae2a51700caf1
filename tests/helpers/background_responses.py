"""Background responses of the OpenAI Responses API, as the API reference documents them, for `FakeChatServer`.

`POST /v1/responses` with `background: true` creates a response that answers `queued`;
`GET /v1/responses/{id}` reads it (`in_progress` for its first `polls` reads, then its
outcome); `POST /v1/responses/{id}/cancel` cancels it. Creations, reads and cancels are counted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from tests.helpers import responses_wire as wire
from tests.helpers.fake_openai import RecordedRequest, Reply

SERVER_ERROR = {"code": "server_error", "message": "The model failed to generate a response."}


@dataclass
class Outcome:
    """What one background response comes to: its output items once done, or `error` (then it fails)."""

    output: list[dict[str, Any]] = field(default_factory=list)
    polls: int = 2
    error: dict[str, Any] | None = None


@dataclass
class _Running:
    outcome: Outcome
    reads: int = 0
    cancelled: bool = False


class BackgroundResponses:
    """The `answer` of a `FakeChatServer` that runs background responses: each creation takes the next `Outcome`."""

    def __init__(self, *outcomes: Outcome) -> None:
        self._outcomes = list(outcomes)
        self._responses: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self.created: list[dict[str, Any]] = []
        self.reads = 0
        self.cancels: list[str] = []

    def __call__(self, request: RecordedRequest) -> Reply:
        path = request.path.removeprefix("/v1/responses")
        with self._lock:
            if path == "":
                return self._create(request.body)
            response_id, _, action = path.lstrip("/").partition("/")
            running = self._responses.get(response_id)
            if running is None:
                return Reply(
                    404,
                    {"error": {"message": f"No response with id '{response_id}'.", "type": "invalid_request_error"}},
                )
            if action == "cancel":
                self.cancels.append(response_id)
                running.cancelled = True
                return Reply(body=self._body(response_id, running, "cancelled"))
            self.reads += 1
            running.reads += 1
            return Reply(body=self._body(response_id, running, self._status(running)))

    def _create(self, body: dict[str, Any]) -> Reply:
        if not body.get("background") or body.get("store") is not True:
            return Reply(400, {"error": {"message": "background requires store=true", "type": "invalid_request_error"}})
        if not self._outcomes:
            return Reply(418, {"error": {"message": "no scripted response left", "type": "test_error"}})
        self.created.append(body)
        response_id = f"resp_bg_{len(self.created)}"
        self._responses[response_id] = _Running(self._outcomes.pop(0))
        return Reply(body=self._body(response_id, self._responses[response_id], "queued"))

    @staticmethod
    def _status(running: _Running) -> str:
        if running.cancelled:
            return "cancelled"
        if running.reads <= running.outcome.polls:
            return "in_progress"
        return "failed" if running.outcome.error is not None else "completed"

    @staticmethod
    def _body(response_id: str, running: _Running, status: str) -> dict[str, Any]:
        done = status == "completed"
        output = running.outcome.output if done else []
        error = running.outcome.error if status == "failed" else None
        body = wire.response(*output, status=status, error=error)
        if not done:
            body["usage"] = None
        return {**body, "id": response_id, "background": True}
