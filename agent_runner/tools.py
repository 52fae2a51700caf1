"""Tools: the `@tool` decorator, argument schemas, the tool context and the user-input tool."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, ClassVar, TypedDict, Unpack, overload

import pydantic
from pydantic import ConfigDict, ValidationError, create_model

from agent_runner.errors import AgentRunnerError, DefinitionError, ToolArgumentsError
from agent_runner.forms import AgentFormDefinition, timeout_delta
from agent_runner.messages import ActionStatus, ToolCall
from agent_runner.models import ToolSpec
from agent_runner.operations import OPERATION_KEY
from agent_runner.snapshot import AgentTurn

TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
USER_INPUT_TOOL_NAME = "request_user_input"
INVALID_ARGUMENTS_KEY = "__invalid_arguments__"
"""Key under which a model adapter keeps tool-call arguments that were not a JSON object.

The value is `{"raw": <the text the model sent>, "error": <why it did not parse>}`; the
runner answers such a call with an error ToolMessage so the model can correct itself.
"""


class Tool:
    """A function the model may call, with a JSON Schema for its arguments.

    Build one with the `@tool` decorator. Calling the `Tool` object calls the function
    directly, so decorated functions stay usable in plain code and tests.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
        sensitive: Sequence[str] = (),
        retry_on: Sequence[type[BaseException]] = (),
        idempotent: bool = True,
        approval_timeout: timedelta | float | None = None,
        on_timeout: str = "reject",
    ) -> None:
        self.function = function
        self.idempotent = idempotent
        """False: a re-run could act twice. The runner then saves "started" before the body runs
        and never re-runs a call whose outcome it does not know, whether the worker stopped in
        the body or the body raised (see `reconcile`)."""
        self.reconciler: Callable[[ToolCall, str], ToolOutcome] | None = None
        self.name = name or function.__name__
        if not TOOL_NAME_PATTERN.match(self.name):
            raise DefinitionError(f"tool name {self.name!r} must match {TOOL_NAME_PATTERN.pattern}")
        self.description = description if description is not None else inspect.cleandoc(function.__doc__ or "")
        self.requires_approval = requires_approval
        self._arguments_model = _arguments_model(function, self.name)
        self.parameters: dict[str, Any] = self._arguments_model.model_json_schema()
        self.parameters.pop("title", None)
        unknown = set(sensitive) - set(self._arguments_model.model_fields)
        if unknown:
            raise DefinitionError(f"tool {self.name!r} marks unknown arguments as sensitive: {sorted(unknown)}")
        self.sensitive = frozenset(sensitive)
        for kind in retry_on:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise DefinitionError(f"tool {self.name!r}: retry_on takes exception classes, got {kind!r}")
        self.retry_on: tuple[type[BaseException], ...] = tuple(retry_on)
        """Exception types of this tool that mean "try again later" (besides `RecoverableError`
        and the retry policy's own `retry_on`)."""
        self.approval_timeout = timeout_delta(approval_timeout, f"tool {self.name!r}: approval_timeout")
        """How long a call waits for a person's decision before `on_timeout` applies (None: for ever)."""
        if self.approval_timeout is not None and not requires_approval:
            raise DefinitionError(f"tool {self.name!r}: approval_timeout needs requires_approval=True")
        if on_timeout not in ("reject", "approve"):
            raise DefinitionError(f"tool {self.name!r}: on_timeout must be 'reject' or 'approve', got {on_timeout!r}")
        self.on_timeout = on_timeout
        """What a call whose approval deadline passed becomes: `"reject"` or `"approve"`."""

    def reconcile(self, function: Callable[[ToolCall, str], ToolOutcome]) -> Callable[[ToolCall, str], ToolOutcome]:
        """Register the function that finds out what became of a call whose outcome is unknown.

        Used as a decorator on a non-idempotent tool (`@send_email.reconcile`). The outcome
        is unknown after a crash between the start of the body and the save of its result,
        and when the body raised anything but `RecoverableError` or `ToolError` (a timeout
        or a dropped connection says nothing about whether the call acted). The runner then
        calls `function(call, idempotency_key)` instead of running the body again; it
        returns `ToolOutcome.done(result)` (`result` is the call's answer),
        `ToolOutcome.not_done()` (after a crash the body runs again; after an error the
        error is retried on the retry schedule, or fails the turn if it is not transient)
        or `ToolOutcome.unknown(why)` (a person decides: retry, mark done with a result, or
        fail). It runs right after the body raised, so a system that takes a while to show
        a call should answer `unknown` rather than `not_done` while it cannot tell.
        """
        if self.idempotent:
            raise DefinitionError(f"tool {self.name!r} is idempotent: only @tool(idempotent=False) tools reconcile")
        self.reconciler = function
        return function

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def validate_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the model's arguments and return them converted to the function's types.

        Raises:
            ToolArgumentsError: The arguments do not fit the schema.
        """
        try:
            model = self._arguments_model.model_validate(dict(arguments))
        except ValidationError as exc:
            errors = [f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in exc.errors()]
            raise ToolArgumentsError(self.name, errors) from None
        return {name: getattr(model, name) for name in self._arguments_model.model_fields}

    def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Validate the arguments and call the function (an `async def` tool runs to completion here)."""
        result = self.function(**self.validate_arguments(arguments))
        if inspect.iscoroutine(result):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                # The usual case: the runner steps turns on plain threads, so the coroutine
                # gets a loop of its own, with the tool context copied into it.
                return asyncio.run(result)
            result.close()
            raise DefinitionError(
                f"async tool {self.name!r} was called from a thread that runs an event loop; "
                "run the AgentRunner in a worker thread (for example with asyncio.to_thread)"
            )
        return result

    def cancel_operation(self, handle: dict[str, Any]) -> None:
        """Cancel the work a call of this tool started elsewhere (see `agent_runner.operations`); by default nothing.

        Called when a turn ends (cancelled, say) while such work runs; `handle` is the one
        the tool raised `OperationPending` with.
        """

    def call_abandoned(self, state: dict[str, Any]) -> None:
        """The turn ended while a call of this tool kept `state` (see `AgentToolContext.get_tool_state`).

        The call waited for work elsewhere (then `cancel_operation` is called with its
        handle, the default) or for a person's answer to a question it asked; a tool that
        must tell the other side overrides this. Runs with the call's `AgentToolContext`.
        """
        if OPERATION_KEY in state:
            self.cancel_operation(state[OPERATION_KEY])

    def masked_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Return the arguments with sensitive values replaced, for display on a page."""
        return {k: ("***" if k in self.sensitive else v) for k, v in arguments.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation, no context)."""
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, requires_approval={self.requires_approval})"


def _arguments_model(function: Callable[..., Any], tool_name: str) -> type[pydantic.BaseModel]:
    signature = inspect.signature(function)
    try:
        hints = inspect.get_annotations(function, eval_str=True)
    except Exception as exc:  # a forward reference the tool's module cannot resolve
        raise DefinitionError(f"tool {tool_name!r}: cannot resolve its type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise DefinitionError(f"tool {tool_name!r}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(parameter.name, Any)
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    config = ConfigDict(extra="forbid")
    return create_model(f"{tool_name}_arguments", __config__=config, **fields)


class ToolOptions(TypedDict, total=False):
    """The keywords of `@tool(...)`: those of `Tool` besides the function, with its defaults."""

    name: str | None
    description: str | None
    requires_approval: bool
    sensitive: Sequence[str]
    retry_on: Sequence[type[BaseException]]
    idempotent: bool
    approval_timeout: timedelta | float | None
    on_timeout: str


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(**options: Unpack[ToolOptions]) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None, /, **options: Unpack[ToolOptions]
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a `Tool`; usable bare (`@tool`) or with keywords.

    Args:
        function: The function; its type hints become the JSON Schema of the arguments.
        name: Tool name shown to the model (default: the function name).
        description: Description shown to the model (default: the docstring).
        requires_approval: Suspend for a person's approval before every call.
        sensitive: Argument names never shown on approval cards or page messages.
        retry_on: Exception types this tool raises for transient failures (its own client's
            connection errors, say): the call is retried on the retry schedule instead of
            failing the turn. For a non-idempotent tool only once its reconcile function
            says the call did not act (see `idempotent`).
        idempotent: False for a tool that could act twice if run again (an email, a payment
            without idempotency keys): its start is saved before the body runs, and a call
            whose outcome is unknown is reconciled or put to a person instead of being re-run
            blindly. Unknown means the worker stopped in the body, or the body raised anything
            but `RecoverableError` (raise it to say "nothing happened, retry me") or
            `ToolError` (the call's answer for the model; raise it when the call did not act,
            or say in it what it did). A timeout or connection error out of the body is
            unknown, whatever the retry policy says.
        approval_timeout: With `requires_approval`, how long a call waits for a decision
            (a `timedelta` or seconds). When the deadline passes, the deadline sweep applies
            `on_timeout` through the normal resume path, recorded as decided by `"system"`
            with the reason "deadline passed".
        on_timeout: `"reject"` (the model is told the call was not approved in time) or
            `"approve"` (the call runs).
    """

    def wrap(fn: Callable[..., Any]) -> Tool:
        return Tool(fn, **options)

    return wrap(function) if function is not None else wrap


@dataclass
class AgentUserInputTool:
    """The built-in `request_user_input` tool: the model asks the user to fill in one of these forms.

    The runner never executes it; it suspends the turn with the form's full JSON Schema
    frozen into the suspension, and the submitted data becomes the call's ToolMessage.
    """

    forms: list[AgentFormDefinition] = field(default_factory=list)
    name: ClassVar[str] = USER_INPUT_TOOL_NAME
    requires_approval: ClassVar[bool] = False
    sensitive: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        keys = [f.key for f in self.forms]
        if len(set(keys)) != len(keys):
            raise DefinitionError(f"request_user_input has duplicate form keys: {keys}")

    def form(self, key: str) -> AgentFormDefinition | None:
        """Return the registered form with this key, or None."""
        return next((f for f in self.forms if f.key == key), None)

    @property
    def description(self) -> str:
        """Description shown to the model, listing the forms it may request."""
        lines = ["Ask the user to fill in a form. Never guess missing fields; request the form instead. Forms:"]
        lines += [f"- {f.key}: {f.description}" for f in self.forms]
        return "\n".join(lines)

    @property
    def parameters(self) -> dict[str, Any]:
        """JSON Schema of the arguments: `{"formKey": <one of the form keys>}`."""
        return {
            "type": "object",
            "properties": {"formKey": {"type": "string", "description": "Key of the form to show the user."}},
            "required": ["formKey"],
            "additionalProperties": False,
        }

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def masked_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Arguments as shown on a page (nothing here is sensitive)."""
        return dict(arguments)


AnyTool = Tool | AgentUserInputTool


@dataclass(frozen=True, slots=True)
class ToolApproval:
    """The decision that approved a tool call: who, when and why."""

    decided_by: str | None
    """Who approved (the resume's `decided_by` or `approverId` metadata, the token's user on the
    HTTP server, `--by` on the command line; `"system"` when a deadline approved it)."""
    decided_at: datetime
    """When the approval was recorded (UTC)."""
    reason: str | None
    """Why, when the approver said so."""


@dataclass(frozen=True, slots=True)
class _ToolScope:
    turn: AgentTurn
    tool_call: ToolCall
    submitted_form_data: dict[str, Any]
    progress: Callable[[Any], None]


_current: contextvars.ContextVar[_ToolScope | None] = contextvars.ContextVar("agent_tool_context", default=None)


class AgentToolContext:
    """What a running tool knows about its call. Get it with `AgentToolContext.current()`."""

    def __init__(self, scope: _ToolScope) -> None:
        self._scope = scope

    @classmethod
    def current(cls) -> AgentToolContext:
        """Return the context of the tool call running in this thread.

        Raises:
            AgentRunnerError: Called outside a tool run by the runner.
        """
        scope = _current.get()
        if scope is None:
            raise AgentRunnerError("AgentToolContext.current() is only available inside a tool run by the runner")
        return cls(scope)

    @property
    def turn_id(self) -> str:
        """Id of the turn that made the call."""
        return self._scope.turn.id

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The metadata the caller started the turn with (a sub-agent's turn has its parent's), read-only.

        Use it to learn whom the call acts for, for example a user id the app passed.
        """
        return MappingProxyType(copy.deepcopy(self._scope.turn.metadata))

    @property
    def tenant_id(self) -> str | None:
        """The tenant that owns the turn, or None in a single-tenant deployment."""
        return self._scope.turn.tenant_id

    @property
    def conversation_id(self) -> str | None:
        """The conversation of the turn (of its root turn for a sub-agent), as the caller named it.

        Together with `tenant_id` it names the conversation: two tenants may use the same
        id. None for a turn outside a conversation.
        """
        turn = self._scope.turn
        return turn.conversation_id or turn.root_conversation_id

    @property
    def approval(self) -> ToolApproval | None:
        """Who approved this call, when and why; None for a call that needed no approval."""
        turn = self._scope.turn
        call_id = self._scope.tool_call.id
        if call_id not in turn.approved_call_ids:
            return None
        action = next((a for a in turn.page_actions if a.action_id == call_id and a.kind == "approval"), None)
        if action is None or action.status is not ActionStatus.APPROVED or "decided_at" not in action.decision:
            return None
        decision = action.decision
        return ToolApproval(
            decided_by=decision.get("decided_by"),
            decided_at=datetime.fromisoformat(decision["decided_at"]),
            reason=decision.get("reason"),
        )

    @property
    def tool_call(self) -> ToolCall:
        """The call being executed."""
        return self._scope.tool_call

    def get_idempotency_key(self) -> str:
        """A key that is the same on every retry and re-execution of this call; use it for side effects."""
        return f"{self._scope.turn.id}:{self._scope.tool_call.id}"

    def get_submitted_form_data(self) -> dict[str, Any]:
        """The form data the user submitted for this call, or `{}` when none was submitted."""
        return dict(self._scope.submitted_form_data)

    @property
    def form_declined(self) -> bool:
        """Whether the person declined the form this call last asked for (see `AgentFormRequiredException`)."""
        call_id = self._scope.tool_call.id
        return any(
            a.action_id == call_id and a.kind == "form" and a.status is ActionStatus.REJECTED
            for a in self._scope.turn.page_actions
        )

    def get_tool_state(self) -> dict[str, Any]:
        """The state this call kept when it last asked for a form (see `AgentFormRequiredException`), or `{}`."""
        return copy.deepcopy(self._scope.turn.tool_state.get(self._scope.tool_call.id, {}))

    def report_progress(self, data: Any) -> None:
        """Emit a TOOL_PROGRESS event with `data` (JSON-serializable)."""
        self._scope.progress(data)


def tool_scope(
    turn: AgentTurn, tool_call: ToolCall, submitted_form_data: dict[str, Any], progress: Callable[[Any], None]
) -> _ScopeBlock:
    """Make `AgentToolContext.current()` describe this call of `turn` while the block runs."""
    return _ScopeBlock(_ToolScope(turn, tool_call, submitted_form_data, progress))


class _ScopeBlock:
    """The `with` block of `tool_scope`; a class, which enters and leaves in a sixth of a generator's CPU."""

    __slots__ = ("scope", "token")

    def __init__(self, scope: _ToolScope) -> None:
        self.scope = scope

    def __enter__(self) -> None:
        self.token = _current.set(self.scope)

    def __exit__(self, *exc: object) -> None:
        _current.reset(self.token)


@dataclass(frozen=True)
class ToolOutcome:
    """What a reconcile function found out about a call whose outcome was not recorded."""

    state: str
    """`"done"`, `"not_done"` or `"unknown"`."""
    result: Any = None
    """The call's result when done (becomes the ToolMessage content)."""
    note: str = ""
    """Why the outcome is unknown, shown to the person who decides."""

    @classmethod
    def done(cls, result: Any) -> ToolOutcome:
        """The call took effect; `result` is what the tool would have returned."""
        return cls("done", result=result)

    @classmethod
    def not_done(cls) -> ToolOutcome:
        """The call took no effect: running the body again is safe."""
        return cls("not_done")

    @classmethod
    def unknown(cls, note: str = "") -> ToolOutcome:
        """It cannot be told: a person decides (retry, mark done with a result, or fail)."""
        return cls("unknown", note=note)


def encode_tool_result(value: Any) -> str:
    """Encode a tool's return value as ToolMessage content: strings as-is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)
