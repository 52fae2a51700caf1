"""A2A 1.0 shapes: turns as tasks, the agent card, the parts of incoming messages, typed JSON-RPC errors.

A task is a turn (`id` = turn id) and its `contextId` the turn's conversation. The JSON
follows the protocol's JSON mapping (camelCase fields, `TASK_STATE_*` and `ROLE_*` enums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_runner import Agent, AgentTurn, AgentTurnStatus
from workers.views import shown_error, suspension_view

PROTOCOL_VERSION = "1.0"
ANSWER_ARTIFACT = "answer"
"""The artifact id of a completed task's answer."""

MAX_PARTS = 64
MAX_TEXT_CHARS = 200_000
MAX_DATA_DEPTH = 16

# JSON-RPC 2.0 and A2A error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED_OPERATION = -32004

_STATES = {
    AgentTurnStatus.READY: "TASK_STATE_SUBMITTED",
    AgentTurnStatus.RUNNING: "TASK_STATE_WORKING",
    AgentTurnStatus.WAITING_FOR_CHILD: "TASK_STATE_WORKING",
    AgentTurnStatus.RETRY_SCHEDULED: "TASK_STATE_WORKING",
    AgentTurnStatus.WAITING_FOR_USER: "TASK_STATE_INPUT_REQUIRED",
    AgentTurnStatus.WAITING_FOR_APPROVAL: "TASK_STATE_INPUT_REQUIRED",
    AgentTurnStatus.COMPLETED: "TASK_STATE_COMPLETED",
    AgentTurnStatus.CANCELLED: "TASK_STATE_CANCELED",
}

STREAM_ENDS = frozenset(
    {"TASK_STATE_INPUT_REQUIRED", "TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"}
)
"""The task states a stream ends at: the task ended, or waits for an answer that comes in another request."""


class RpcError(Exception):
    """A JSON-RPC error answer: `code` is a JSON-RPC or A2A error code."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        """The `error` member of the answer."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def task_state(turn: AgentTurn) -> str:
    """The A2A task state of the turn's status (a limit reached is a failure)."""
    return _STATES.get(turn.status, "TASK_STATE_FAILED")


def _agent_message(turn: AgentTurn, parts: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"messageId": f"{turn.id}:{turn.version}", "taskId": turn.id, "role": "ROLE_AGENT"}
    if turn.conversation_id is not None:
        message["contextId"] = turn.conversation_id
    message["parts"] = parts
    return message


def task_status(turn: AgentTurn, agent: Agent | None) -> dict[str, Any]:
    """The task status of the turn, with a message saying what it waits for, answered or why it failed."""
    state = task_state(turn)
    status: dict[str, Any] = {"state": state, "timestamp": turn.updated_at.isoformat()}
    parts: list[dict[str, Any]] = []
    if state == "TASK_STATE_INPUT_REQUIRED":
        waiting = suspension_view(turn, agent)
        if waiting is not None:
            if waiting["message"]:
                parts.append({"text": str(waiting["message"])})
            parts.append({"data": waiting, "mediaType": "application/json"})
    elif state == "TASK_STATE_COMPLETED" and turn.final_output:
        parts.append({"text": turn.final_output})
    elif state == "TASK_STATE_FAILED":
        parts.append({"text": shown_error(turn) or f"the turn ended with status {turn.status.value}"})
    if parts:
        status["message"] = _agent_message(turn, parts)
    return status


def task_view(turn: AgentTurn, agent: Agent | None) -> dict[str, Any]:
    """The A2A task of a turn: status, the answer as an artifact once completed, our status in metadata."""
    task: dict[str, Any] = {"id": turn.id}
    if turn.conversation_id is not None:
        task["contextId"] = turn.conversation_id
    task["status"] = task_status(turn, agent)
    if turn.status is AgentTurnStatus.COMPLETED and turn.final_output:
        task["artifacts"] = [{"artifactId": ANSWER_ARTIFACT, "name": "answer", "parts": [{"text": turn.final_output}]}]
    task["metadata"] = {"agentId": turn.agent_id, "turnStatus": turn.status.value}
    return task


def agent_card(agent: Agent, url: str, *, secured: bool) -> dict[str, Any]:
    """The agent card: one skill per tool (or the agent itself when it has none), streaming, no push notifications."""
    skills = [
        {"id": spec.name, "name": spec.name, "description": spec.description or spec.name, "tags": ["tool"]}
        for spec in agent.tool_specs()
    ]
    if not skills:
        skills = [{"id": agent.id, "name": agent.id, "description": agent.description or agent.id, "tags": ["agent"]}]
    card: dict[str, Any] = {
        "name": agent.id,
        "description": agent.description or f"The {agent.id} agent.",
        "version": agent.version or "1",
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION}],
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    }
    if secured:
        card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    return card


@dataclass(frozen=True)
class Incoming:
    """What an incoming message carries: its id, the ids it continues, its text and its one data part."""

    message_id: str
    context_id: str | None
    task_id: str | None
    text: str
    data: dict[str, Any] | None
    metadata: dict[str, Any]


def _depth(value: Any, limit: int) -> int:
    """How deeply `value` nests, counting no further than past `limit`."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def _identifier(value: Any, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 128 or not all(c.isalnum() or c in "._:-" for c in value):
        raise RpcError(
            INVALID_PARAMS, f"message.{name} must be an id of at most 128 letters, digits, '.', '_', ':', '-'"
        )
    return value


def parse_message(params: Any) -> Incoming:
    """The message of SendMessage's params, checked.

    Raises:
        RpcError: The params hold no usable message (INVALID_PARAMS), too many or too large parts.
    """
    message = params.get("message") if isinstance(params, dict) else None
    if not isinstance(message, dict):
        raise RpcError(INVALID_PARAMS, "params.message must be an object")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise RpcError(INVALID_PARAMS, "message.parts must be a non-empty list")
    if len(parts) > MAX_PARTS:
        raise RpcError(INVALID_PARAMS, f"a message takes at most {MAX_PARTS} parts")
    message_id = _identifier(message.get("messageId"), "messageId")
    if message_id is None:
        raise RpcError(INVALID_PARAMS, "message.messageId is required")
    texts: list[str] = []
    data: dict[str, Any] | None = None
    for number, part in enumerate(parts):
        if not isinstance(part, dict):
            raise RpcError(INVALID_PARAMS, f"message.parts[{number}] must be an object")
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif "data" in part:
            if _depth(part["data"], MAX_DATA_DEPTH) > MAX_DATA_DEPTH:
                raise RpcError(INVALID_PARAMS, f"message.parts[{number}].data nests deeper than {MAX_DATA_DEPTH}")
            if not isinstance(part["data"], dict) or data is not None:
                raise RpcError(INVALID_PARAMS, "a message takes at most one data part, a JSON object")
            data = part["data"]
        else:
            raise RpcError(INVALID_PARAMS, f"message.parts[{number}]: only text and data parts are accepted")
    text = "\n".join(texts)
    if len(text) > MAX_TEXT_CHARS:
        raise RpcError(INVALID_PARAMS, f"the message's text exceeds {MAX_TEXT_CHARS} characters")
    metadata = message.get("metadata")
    return Incoming(
        message_id=message_id,
        context_id=_identifier(message.get("contextId"), "contextId"),
        task_id=_identifier(message.get("taskId"), "taskId"),
        text=text,
        data=data,
        metadata=metadata if isinstance(metadata, dict) else {},
    )
