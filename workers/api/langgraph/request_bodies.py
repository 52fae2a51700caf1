"""Request bodies of the LangGraph API, as the `langgraph-sdk` clients send them.

Fields the clients send that this server does not act on are listed too: left at their
defaults they are accepted, set to something that would change the outcome they are
answered with 501 `NotSupportedError` naming them (see the routes). Unknown fields, and values
of another JSON type than the field's (`0` for a boolean, `"5"` for a number), are a 422.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.api.bodies import Identifier, JsonObject, WholeNumber

StreamMode = Literal[
    "values", "updates", "messages-tuple", "messages", "custom", "events", "debug", "tasks", "checkpoints"
]
MultitaskStrategy = Literal["reject", "enqueue", "interrupt", "rollback", "steer"]
"""LangGraph's four strategies, and `steer` (this server's: the input joins the thread's active run, `if_busy=steer`)."""
MAX_OFFSET = 2**31 - 1
"""The largest page offset: past any page a store serves, and within the integers every database binds."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ThreadCreate(_Body):
    """`POST /threads`."""

    thread_id: Identifier | None = None
    metadata: JsonObject = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"
    supersteps: list[Any] | None = None
    graph_id: str | None = None
    ttl: Any = None


class ThreadPatch(_Body):
    """`PATCH /threads/{thread_id}`."""

    metadata: JsonObject = Field(default_factory=dict)
    ttl: Any = None


class _Search(_Body):
    """What every search body takes: the page (`limit` from `offset`), its order and the fields to return."""

    limit: WholeNumber = Field(default=10, ge=1, le=1000)
    offset: WholeNumber = Field(default=0, ge=0, le=MAX_OFFSET)
    sort_by: str | None = None
    sort_order: str | None = None
    select: list[str] | None = None


class ThreadSearch(_Search):
    """`POST /threads/search`."""

    metadata: JsonObject | None = None
    values: JsonObject | None = None
    ids: list[str] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    sort_by: Literal["created_at", "updated_at", "thread_id", "status"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    extract: Any = None


class ThreadHistoryQuery(_Body):
    """`POST /threads/{thread_id}/history`."""

    limit: WholeNumber = Field(default=10, ge=1, le=1000)
    before: Any = None
    metadata: JsonObject | None = None
    checkpoint: Any = None
    select: list[str] | None = None


class AssistantSearch(_Search):
    """`POST /assistants/search`."""

    metadata: JsonObject | None = None
    graph_id: str | None = None
    name: str | None = None


class Command(_Body):
    """A run's `command`: only `resume` is supported."""

    resume: Any = None
    update: Any = None
    goto: Any = None


class RunCreate(_Body):
    """The body of every run creation (`/threads/{id}/runs[/stream|/wait]`, `/runs[/stream|/wait]`)."""

    assistant_id: str = Field(min_length=1, max_length=128)
    input: Any = None
    command: Command | None = None
    metadata: JsonObject = Field(default_factory=dict)
    config: JsonObject | None = None
    context: JsonObject | None = None
    stream_mode: StreamMode | list[StreamMode] = "values"
    stream_subgraphs: bool = False
    stream_resumable: bool = False
    multitask_strategy: MultitaskStrategy = "reject"
    if_not_exists: Literal["create", "reject"] | None = None
    after_seconds: float | None = Field(default=None, ge=0)
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    interrupt_before: Any = None
    interrupt_after: Any = None
    feedback_keys: Any = None
    webhook: str | None = None
    checkpoint: Any = None
    checkpoint_id: str | None = None
    checkpoint_during: bool | None = None
    durability: str | None = None
    strict_resume: bool | None = None
    langsmith_tracer: Any = None

    def modes(self) -> list[str]:
        """The stream modes asked for, in order, without repeats."""
        modes = [self.stream_mode] if isinstance(self.stream_mode, str) else list(self.stream_mode)
        return list(dict.fromkeys(modes))


class CronCreate(RunCreate):
    """`POST /runs/crons` and `/threads/{thread_id}/runs/crons`."""

    schedule: str = Field(min_length=1, max_length=200)
    timezone: str | None = None
    end_time: Any = None
    enabled: bool = True
    on_run_completed: Any = None


class CronSearch(_Search):
    """`POST /runs/crons/search`."""

    assistant_id: str | None = None
    thread_id: str | None = None
    enabled: bool | None = None


class CronPatch(_Body):
    """`PATCH /runs/crons/{cron_id}`: only `enabled` changes; any other field present is a 501.

    The other fields are those the clients send to change a cron; they are listed so that
    the body is documented and checked like every other one.
    """

    enabled: bool | None = None
    schedule: Any = None
    end_time: Any = None
    input: Any = None
    metadata: Any = None
    config: Any = None
    context: Any = None
    webhook: Any = None
    interrupt_before: Any = None
    interrupt_after: Any = None
    on_run_completed: Any = None
    timezone: Any = None
    stream_mode: Any = None
    stream_subgraphs: Any = None
    stream_resumable: Any = None
    durability: Any = None
