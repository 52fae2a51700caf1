"""Pieces of the HTTP server that need no server: API keys, the JSON guard, resume commands, tenants, views."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_runner import Agent, AgentTurn, InputLimitError, ResumeType, ScriptedChatModel, ToolCall, TurnNotFound, tool
from agent_runner.persistence import ConversationKey
from workers.api.errors import InvalidRequestError
from workers.api.guard import check_json, json_depth
from workers.api.server_settings import ApiKeys, ApiSettings, WorkerMode
from workers.api.tenancy import ConversationNotFoundError, Tenant
from workers.settings import SettingsError
from workers.views import (
    ErrorKind,
    ResumeAction,
    ResumeRequestError,
    catalog_mask,
    classify_error,
    masked_arguments,
    resume_command,
)


def test_api_keys_map_keys_to_tenants_and_refuse_bad_entries() -> None:
    keys = ApiKeys.parse(" acme:k-1 , globex:k-2,")
    assert keys.enabled and keys.tenants == {"acme", "globex"}
    assert keys.tenant_of("k-1") == "acme" and keys.tenant_of("k-2") == "globex"
    assert keys.tenant_of("k-3") is None and keys.tenant_of("") is None and keys.tenant_of("\udcff") is None
    assert not ApiKeys.parse(None).enabled and not ApiKeys.parse("  ").enabled
    for bad in ("acme", "acme:", "a/b:sekret-1", "a b:sekret-1", "acme:sekret-1,globex:sekret-1", ":sekret-1"):
        with pytest.raises(SettingsError) as raised:
            ApiKeys.parse(bad)
        # The error names the variable, never a key
        assert raised.value.variable == "AGENT_RUNNER_API_KEYS" and "sekret" not in str(raised.value)
    assert "k-1" not in repr(keys)


def test_settings_choose_the_worker_mode_from_the_database() -> None:
    assert ApiSettings.from_env({}).worker_mode is WorkerMode.EMBEDDED
    postgres = {"AGENT_RUNNER_DATABASE_URL": "postgresql+psycopg://db/x"}
    assert ApiSettings.from_env(postgres).worker_mode is WorkerMode.CELERY
    assert ApiSettings.from_env({**postgres, "AGENT_RUNNER_API_WORKER": "none"}).worker_mode is WorkerMode.NONE
    with pytest.raises(SettingsError, match="AGENT_RUNNER_API_WORKER"):
        ApiSettings.from_env({"AGENT_RUNNER_API_WORKER": "threads"})
    with pytest.raises(SettingsError, match="AGENT_RUNNER_API_INTERRUPT_WAIT_S"):
        ApiSettings.from_env({"AGENT_RUNNER_API_INTERRUPT_WAIT_S": "-1"})


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("{}", 1),
        ("[[[1]], [2]]", 3),
        ('{"a": "[[[[[["}', 1),
        ('["\\\\", [[]]]', 3),
        ('["\\"[[[[", []]', 2),
        ('"just a string"', 0),
    ],
)
def test_json_depth_skips_brackets_inside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 65 + b"]" * 65,
        b'{"a": NaN}',
        b'{"a": 1e999}',
        b'{"a": "\\u0000"}',
        b'{"\\ud83d": 1}',
        b'["\\udfff"]',
        b"\xc3\x28",
        b'{"a": ',
    ],
)
def test_check_json_refuses_what_cannot_be_stored(body: bytes) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        check_json(body)
    assert raised.value.status == 422


def test_check_json_accepts_ordinary_bodies() -> None:
    check_json(json.dumps({"a": ["x" * 10, {"b": 1.5, "c": None}], "emoji": "\U0001f600"}).encode())
    check_json(b"[" * 64 + b"]" * 64)


def test_resume_commands_need_exactly_their_fields() -> None:
    assert resume_command(ResumeAction.APPROVE, tool_call_id="c1").type is ResumeType.APPROVE_TOOL
    rejected = resume_command(ResumeAction.REJECT, tool_call_id="c1", metadata={"by": "u"})
    assert rejected.reason == "rejected by the user" and rejected.metadata == {"by": "u"}
    assert resume_command(ResumeAction.FORM, tool_call_id="c1", data={}).data == {}
    assert resume_command(ResumeAction.INPUT, content="x").content == "x"
    settled = resume_command(ResumeAction.TOOL_RESULT, tool_call_id="c1", content="paid")
    assert (settled.type, settled.tool_call_id, settled.content) == (ResumeType.TOOL_RESULT, "c1", "paid")
    for action, fields in [
        (ResumeAction.APPROVE, {}),
        (ResumeAction.APPROVE, {"tool_call_id": "c1", "content": "yes"}),
        (ResumeAction.TOOL_RESULT, {"tool_call_id": "c1"}),
        (ResumeAction.TOOL_RESULT, {"content": "paid"}),
        (ResumeAction.FORM, {"tool_call_id": "c1"}),
        (ResumeAction.INPUT, {"content": "x", "data": {}}),
        (ResumeAction.RETRY, {"tool_call_id": "c1"}),
    ]:
        with pytest.raises(ResumeRequestError):
            resume_command(action, **fields)  # type: ignore[arg-type]
    assert classify_error(ResumeRequestError("x")) is ErrorKind.INVALID
    assert classify_error(TurnNotFound("t")) is ErrorKind.NOT_FOUND


def test_an_approval_or_settled_call_keeps_its_reason_in_the_metadata() -> None:
    # Only a rejection's reason is read by the model; the others are kept with the decision.
    approved = resume_command(
        ResumeAction.APPROVE, tool_call_id="c1", reason="checked", metadata={"decided_by": "u-1", "reason": "old"}
    )
    assert approved.reason is None and approved.metadata == {"decided_by": "u-1", "reason": "checked"}
    settled = resume_command(ResumeAction.TOOL_RESULT, tool_call_id="c1", content="paid", reason="bank says so")
    assert settled.reason is None and settled.metadata == {"reason": "bank says so"}
    rejected = resume_command(ResumeAction.REJECT, tool_call_id="c1", reason="no")
    assert rejected.reason == "no" and rejected.metadata == {}


def test_tenants_name_conversations_beside_their_id_and_see_only_their_turns() -> None:
    acme, single = Tenant("acme"), Tenant()
    assert acme.conversation_key("c-1") == ConversationKey("c-1", "acme") != single.conversation_key("c-1")
    assert single.conversation_key("c-1") == ConversationKey("c-1")
    with pytest.raises(InputLimitError):
        acme.conversation_key("c/1")
    # A token limited to one conversation reaches that one of its own tenant only
    bound = Tenant("acme", user="u", conversation="c-1")
    assert bound.reaches("c-1") == ConversationKey("c-1", "acme")
    with pytest.raises(ConversationNotFoundError):
        bound.reaches("c-2")
    assert not bound.owns(AgentTurn(id="t", agent_id="a", tenant_id="globex", conversation_id="c-1"))
    turn = AgentTurn(id="t", agent_id="a", tenant_id="globex")
    assert single.owns(turn) and not acme.owns(turn)
    with pytest.raises(TurnNotFound):
        acme.check(turn)


@tool(sensitive=["token"])
def call_api(url: str, token: str) -> str:
    """Call an API."""
    return url


def test_masks_hide_sensitive_arguments_and_everything_of_unknown_tools() -> None:
    agent = Agent(id="a", chat_model=ScriptedChatModel([]), tools=[call_api])
    call = ToolCall(id="c1", name="call_api", arguments={"url": "u", "token": "secret"})
    assert masked_arguments(agent, call) == {"url": "u", "token": "***"}
    assert masked_arguments(None, call) == {"url": "***", "token": "***"}

    class Loader:
        def load(self, agent_id: str, version: str | None = None) -> Agent:
            return agent

        def agents(self) -> list[Agent]:
            return [agent]

    mask: Any = catalog_mask(Loader())
    assert mask(call) == {"url": "u", "token": "***"}
    assert mask(ToolCall(id="c2", name="made_up", arguments={"x": 1})) == {"x": "***"}


def test_event_data_shows_the_tenants_conversation_and_masks_arguments() -> None:
    from agent_runner import AgentEvent, AgentEventType
    from workers.api.event_streams import format_event

    agent = Agent(id="a", chat_model=ScriptedChatModel([]), tools=[call_api])

    class Loader:
        def load(self, agent_id: str, version: str | None = None) -> Agent:
            return agent

        def agents(self) -> list[Agent]:
            return [agent]

    event = AgentEvent(
        type=AgentEventType.TOOL_STARTED,
        turn_id="t1",
        root_turn_id="t1",
        conversation_id="c-1",
        tenant_id="acme",
        data={"tool_call_id": "c1", "tool_name": "call_api", "arguments": {"url": "u", "token": "secret"}},
        cursor="0.1:",
    )
    text = format_event(event, catalog_mask(Loader()))
    lines = text.split("\n")
    assert lines[0] == "id: 0.1:" and lines[1] == "event: TOOL_STARTED" and text.endswith("\n\n")
    data = json.loads(lines[2].removeprefix("data: "))
    assert data["conversation_id"] == "c-1" and data["data"]["arguments"] == {"url": "u", "token": "***"}
    assert "tenant_id" not in data


def test_errors_renamed_to_end_in_error_answer_with_the_type_clients_know() -> None:
    # Given the API errors whose classes took the `Error` suffix
    from agent_runner import InvalidCursorError, InvalidEventQueryError
    from workers.api.errors import (
        IdempotencyKeyReusedError,
        PayloadTooLargeError,
        RecordNotFoundError,
        UnauthorizedError,
        api_error_of,
    )
    from workers.api.langgraph.mapping import NotSupportedError
    from workers.api.langgraph.runs import RollbackNotSupportedError
    from workers.api.langgraph.threads import ThreadExistsError, ThreadNotFoundError
    from workers.api.protocols.chat import NothingToAnswerError
    from workers.api.tokens import InvalidTokenError, TokenNotAllowedError, TokensDisabledError

    answers = {
        "Unauthorized": UnauthorizedError(),
        "InvalidRequest": InvalidRequestError("bad", path="/input"),
        "PayloadTooLarge": PayloadTooLargeError(10),
        "IdempotencyKeyReused": IdempotencyKeyReusedError("k-1"),
        "InvalidToken": InvalidTokenError("expired"),
        "TokensDisabled": TokensDisabledError(),
        "TokenNotAllowed": TokenNotAllowedError(),
        "NothingToAnswer": NothingToAnswerError("c-1", "nothing waits"),
        "ThreadNotFound": ThreadNotFoundError("t-1"),
        "ThreadExists": ThreadExistsError("t-1"),
        "RunNotFound": RecordNotFoundError("run", "r-1"),
        "CronNotFound": RecordNotFoundError("cron", "c-1"),
        "NotSupported": NotSupportedError("stateless runs"),
        "RollbackNotSupported": RollbackNotSupportedError("/multitask_strategy"),
        "InvalidCursor": api_error_of(InvalidCursorError("x")),
        "InvalidEventQuery": api_error_of(InvalidEventQueryError("an empty id")),
        "ConversationNotFound": ConversationNotFoundError("c-1"),
    }
    # Then each answers with the `type` it had before, which clients read
    assert {wire: error.type_name for wire, error in answers.items()} == {wire: wire for wire in answers}
    assert ThreadNotFoundError("t-1").status == RecordNotFoundError("run", "r-1").status == 404
