"""The OpenAPI document is generated from the Python definitions and matches what the API sends."""

from __future__ import annotations

import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient

from agent_runner import (
    ActionStatus,
    Agent,
    AgentEventType,
    AgentFormDefinition,
    AgentResumeCommand,
    AgentRunner,
    AgentTurnStatus,
    AgentUserInputTool,
    AiMessage,
    InMemoryAgentLoader,
    InMemoryChatMemoryProvider,
    Phase,
    ScriptedChatModel,
    SuspensionType,
    ToolCall,
    tool,
)
from agent_runner.event_payloads import PAYLOAD_MODELS
from agent_runner.suspensions import TimeoutAction
from tests.helpers.node import json_lines, run_node
from tests.unit.agent_runner.turn_kit import EventLog
from workers.api import create_app
from workers.api.bodies import (
    EVENT_VIEWS,
    RESUME_REQUESTS,
    AgentEventView,
    MessageList,
    ResumeRequest,
    TurnView,
)
from workers.views import _ACTION_FIELDS, ResumeAction, catalog_mask, message_view, turn_view


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("spec") / "api.db"
    with TestClient(
        create_app(database_url=f"sqlite:///{path}", worker="none", agents=InMemoryAgentLoader([]))
    ) as client:
        document: dict[str, Any] = client.get("/openapi.json").json()
    return document


@pytest.mark.parametrize("enum", [AgentTurnStatus, Phase, SuspensionType, ActionStatus, TimeoutAction])
def test_each_enum_of_the_document_lists_the_values_of_its_python_definition(
    spec: dict[str, Any], enum: type[StrEnum]
) -> None:
    assert spec["components"]["schemas"][enum.__name__]["enum"] == [member.value for member in enum]


def test_the_turn_view_refers_to_the_enums(spec: dict[str, Any]) -> None:
    properties = spec["components"]["schemas"]["TurnView"]["properties"]
    assert properties["status"] == {"$ref": "#/components/schemas/AgentTurnStatus"}
    assert properties["phase"] == {"$ref": "#/components/schemas/Phase"}


def test_the_event_views_cover_every_event_type_once(spec: dict[str, Any]) -> None:
    documented: list[str] = []
    for view in EVENT_VIEWS:
        documented.extend(get_args(view.model_fields["type"].annotation))
    assert sorted(documented) == sorted(t.value for t in AgentEventType)
    mapping = spec["components"]["schemas"]["AgentEventView"]["discriminator"]["mapping"]
    assert sorted(mapping) == sorted(t.value for t in AgentEventType)
    stream = spec["paths"]["/v1/turns/{turn_id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
    # The schema is that of one event (its SSE fields); the JSON of its `data` is an AgentEventView
    data = stream["schema"]["properties"]["data"]
    assert data["contentSchema"] == {"$ref": "#/components/schemas/AgentEventView"}


def test_each_resume_request_takes_the_fields_its_action_needs() -> None:
    assert {get_args(r.model_fields["action"].annotation)[0] for r in RESUME_REQUESTS} == {
        a.value for a in ResumeAction
    }
    for request in RESUME_REQUESTS:
        [action] = get_args(request.model_fields["action"].annotation)
        required, optional = _ACTION_FIELDS[ResumeAction(action)]
        fields = request.model_fields
        assert {n for n, f in fields.items() if f.is_required()} - {"action"} == required, action
        assert {n for n, f in fields.items() if not f.is_required()} - {"metadata"} == optional, action


def test_a_resume_body_keeps_its_wire_shape_and_ignores_nulls_of_unused_fields() -> None:
    body: dict[str, Any] = {
        "action": "approve",
        "tool_call_id": "c1",
        "content": None,
        "data": None,
        "reason": None,
        "metadata": {},
    }
    request = ResumeRequest.model_validate(body)
    assert request.model_dump() == {"action": "approve", "tool_call_id": "c1", "reason": None, "metadata": {}}
    with pytest.raises(ValueError):
        ResumeRequest.model_validate({"action": "input", "content": "x", "data": {"a": 1}})
    with pytest.raises(ValueError):
        ResumeRequest.model_validate({"action": "form", "tool_call_id": "c1"})


FORM = AgentFormDefinition(
    key="f", description="Details", schema={"type": "object", "properties": {"a": {"type": "array"}}}
)


@tool(requires_approval=True, sensitive=["token"])
def call_api(url: str, token: str) -> str:
    """Call an API."""
    return url


def test_views_and_events_of_a_conversation_validate_against_the_documented_models() -> None:
    model = ScriptedChatModel(
        [
            AiMessage(tool_calls=[ToolCall(id="c1", name="request_user_input", arguments={"formKey": "f"})]),
            AiMessage(
                content="calling", tool_calls=[ToolCall(id="c2", name="call_api", arguments={"url": "u", "token": "t"})]
            ),
            AiMessage(content="done"),
        ]
    )
    agent = Agent(id="a", chat_model=model, tools=[AgentUserInputTool(forms=[FORM]), call_api])
    memory = InMemoryChatMemoryProvider()
    runner = AgentRunner(chat_memory_provider=memory)
    events = EventLog()
    runner.add_event_listener(events)
    turn = runner.run(agent, "hi", conversation_id="conv")
    turn = runner.resume(turn.id, AgentResumeCommand.user_input("c1", {"a": [[1, 2], {"b": None}]}))
    TurnView.model_validate(turn_view(turn, agent, messages=True))
    turn = runner.resume(turn.id, AgentResumeCommand.approve_tool("c2"))
    assert turn.status is AgentTurnStatus.COMPLETED

    class Loader:
        def load(self, agent_id: str, version: str | None = None) -> Agent:
            return agent

    mask = catalog_mask(Loader())
    items: list[dict[str, Any]] = []
    for message in memory("conv").get_messages(100):
        item = message_view(mask, message)
        actions = getattr(message, "get_actions", None)
        if callable(actions):
            item["actions"] = actions()
        items.append(item)
    assert {item["role"] for item in items} == {"user", "assistant", "tool", "agent_action", "agent_form"}
    listed = MessageList.model_validate({"items": items})
    for item, view in zip(items, listed.items, strict=True):
        assert set(item) == set(view.model_dump(by_alias=True)), item["role"]
    TurnView.model_validate(turn_view(turn, agent, messages=True))
    seen = set()
    for event in events.events:
        envelope = AgentEventView.model_validate(event.model_dump(mode="json")).root
        assert set(envelope.model_dump()) == set(event.model_dump()), event.type
        seen.add(event.type)
    assert {AgentEventType.TURN_SUSPENDED, AgentEventType.TURN_RESUMED, AgentEventType.TURN_COMPLETED} <= seen


OPENAPI_CLIENT = Path(__file__).parents[2] / "clients" / "openapi"
LOOSE = re.compile(r"\b(any|unknown)\b")
"""The TypeScript types that type nothing."""
TYPED_SCHEMAS = (
    "TurnView",
    "SuspensionView",
    "FormView",
    "ToolCallView",
    "UsageView",
    "MessageList",
    "ResumeRequest",
    "AgentEventView",
    "JsonValue",
    "JsonElement",
)


def _schema_blocks(generated: str) -> dict[str, str]:
    """The text of each `components.schemas` entry of an openapi-typescript output, comments left out."""
    blocks: dict[str, str] = {}
    name = None
    for line in generated.splitlines():
        stripped = line.strip()
        if stripped.startswith(("/*", "*", "//")):
            continue
        if line.startswith(" " * 8) and not line.startswith(" " * 9) and ":" in stripped:
            name = stripped.split(":")[0].strip('"')
            blocks[name] = ""
        if line.startswith("    ") and not line.startswith("     ") and stripped:
            name = None  # left `schemas`
        if name is not None:
            blocks[name] += line + "\n"
    return blocks


def test_a_typescript_client_generated_from_the_document_types_a_console_program(
    spec: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "openapi.json").write_text(json.dumps(spec))
    done = run_node(OPENAPI_CLIENT, "check.mjs", [str(tmp_path / "openapi.json"), str(tmp_path)])
    assert done.returncode == 0 and json_lines(done.stdout) == [{"ok": True}], done.stdout + done.stderr
    blocks = _schema_blocks((tmp_path / "api.d.ts").read_text())
    names = [
        *TYPED_SCHEMAS,
        *(view.__name__ for view in EVENT_VIEWS),
        *(payload.__name__ for payload in PAYLOAD_MODELS.values()),
        *(request.__name__ for request in RESUME_REQUESTS),
        *(n for n in blocks if n.endswith(("ItemView", "MessageView"))),
    ]
    assert set(names) <= set(blocks) and len(set(names)) > 40
    for name in names:
        assert not LOOSE.search(blocks[name]), f"{name}:\n{blocks[name]}"


def test_the_schema_blocks_reader_finds_an_unknown() -> None:
    generated = "export interface components {\n    schemas: {\n        A: {\n            x: unknown;\n        };\n    };\n    responses: never;\n}\n"
    assert LOOSE.search(_schema_blocks(generated)["A"])
    assert list(_schema_blocks(generated)) == ["A"]


def test_a_host_app_that_includes_the_routes_lists_the_event_schemas_they_refer_to(tmp_path: Path) -> None:
    from fastapi import FastAPI

    from workers.api import include_api

    host = FastAPI()
    include_api(
        host,
        prefix="/agents",
        database_url=f"sqlite:///{tmp_path / 'h.db'}",
        worker="none",
        agents=InMemoryAgentLoader([]),
    )
    document = host.openapi()
    stream = document["paths"]["/agents/v1/turns/{turn_id}/events"]["get"]["responses"]["200"]["content"]
    data = stream["text/event-stream"]["schema"]["properties"]["data"]
    assert data["contentSchema"] == {"$ref": "#/components/schemas/AgentEventView"}
    assert {"AgentEventView", "TurnSuspendedPayload", "JsonValue"} <= set(document["components"]["schemas"])
