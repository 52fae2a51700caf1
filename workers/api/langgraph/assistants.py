"""Assistants of the LangGraph API: one assistant per registered agent.

The assistant id and the `graph_id` are both the agent id, so `assistant_id="desk"` works
wherever a client names an assistant. The assistant's `version` is the agent's version when
it is a whole number (LangGraph versions are integers), and the agent's own version string
is in `metadata.agent_version`; `POST /assistants/{id}/versions` lists every registered
version. Assistants come from the server's agents: creating, changing or deleting one
through the API is not supported (501).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse

from agent_runner import Agent
from workers.api.auth import RuntimeDep, get_tenant
from workers.api.langgraph.mapping import NotSupportedError
from workers.api.langgraph.request_bodies import AssistantSearch
from workers.api.openapi import error_responses
from workers.api.runtime import Runtime

AssistantId = Annotated[str, Path(max_length=128, description="An assistant id: the agent id.")]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC).isoformat()
"""Agents are defined in code and carry no creation time."""

_MESSAGES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "messages": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string"},
                    "role": {"type": "string"},
                    "content": {"anyOf": [{"type": "string"}, {"type": "array"}]},
                },
            },
        }
    },
    "required": ["messages"],
}
"""What a run takes and a thread holds: LangChain messages under `messages`."""

router = APIRouter(tags=["langgraph"], dependencies=[Depends(get_tenant)], responses=error_responses(404, 501))


def _agents(runtime: Runtime) -> list[Agent]:
    lister = getattr(runtime.agent_loader, "agents", None)
    return list(lister()) if callable(lister) else []


def _version_number(agent: Agent) -> int:
    return int(agent.version) if agent.version.isdigit() else 1


def assistant_view(agent: Agent) -> dict[str, Any]:
    """The `Assistant` object of an agent."""
    return {
        "assistant_id": agent.id,
        "graph_id": agent.id,
        "name": agent.id,
        "description": agent.description or None,
        "config": {},
        "context": {},
        "metadata": {"agent_version": agent.version},
        "version": _version_number(agent),
        "created_at": _EPOCH,
        "updated_at": _EPOCH,
    }


def load_assistant(runtime: Runtime, assistant_id: str) -> Agent:
    """The newest version of the agent an assistant id names.

    Raises:
        AgentNotFound: No such agent (404).
    """
    return runtime.agent_loader.load(assistant_id)


def _latest(runtime: Runtime) -> list[Agent]:
    latest: dict[str, Agent] = {}
    for agent in _agents(runtime):
        latest[agent.id] = runtime.agent_loader.load(agent.id)
    return [latest[name] for name in sorted(latest)]


@router.post("/assistants/search", summary="Search assistants")
def search(body: AssistantSearch, runtime: RuntimeDep) -> JSONResponse:
    """The assistants (one per agent), filtered by `graph_id`, `name` and metadata."""
    if body.sort_by not in (None, "assistant_id", "graph_id", "name") or body.sort_order not in (None, "asc"):
        raise NotSupportedError("sorting assistants other than by id, ascending")
    views = [assistant_view(agent) for agent in _latest(runtime)]
    views = [
        view
        for view in views
        if (body.graph_id is None or view["graph_id"] == body.graph_id)
        and (body.name is None or body.name in view["name"])
        and all(view["metadata"].get(k) == v for k, v in (body.metadata or {}).items())
    ]
    page = views[body.offset : body.offset + body.limit]
    more = body.offset + body.limit < len(views)
    headers = {"X-Pagination-Next": str(body.offset + body.limit)} if more else None
    return JSONResponse(page, headers=headers)


@router.post("/assistants/count", summary="Count assistants")
def count(body: AssistantSearch, runtime: RuntimeDep) -> JSONResponse:
    """How many assistants match `graph_id` and `name`."""
    agents = _latest(runtime)
    return JSONResponse(
        sum(
            1
            for a in agents
            if (body.graph_id is None or a.id == body.graph_id) and (body.name is None or body.name in a.id)
        )
    )


@router.get("/assistants/{assistant_id}", summary="Get an assistant")
def get(assistant_id: AssistantId, runtime: RuntimeDep) -> JSONResponse:
    """The assistant of an agent."""
    return JSONResponse(assistant_view(load_assistant(runtime, assistant_id)))


@router.get("/assistants/{assistant_id}/schemas", summary="An assistant's schemas")
def schemas(assistant_id: AssistantId, runtime: RuntimeDep) -> JSONResponse:
    """Input, output and state are `{"messages": [...]}`; the forms the agent may ask for are in the state schema."""
    agent = load_assistant(runtime, assistant_id)
    user_input = agent.user_input_tool
    forms = [] if user_input is None else [form.to_dict() for form in user_input.forms]
    state = {**_MESSAGES_SCHEMA, "x-forms": forms}
    return JSONResponse(
        {
            "graph_id": agent.id,
            "input_schema": _MESSAGES_SCHEMA,
            "output_schema": _MESSAGES_SCHEMA,
            "state_schema": state,
            "config_schema": {"type": "object", "properties": {}},
            "context_schema": {"type": "object", "properties": {}},
        }
    )


@router.post("/assistants/{assistant_id}/versions", summary="An assistant's versions")
def versions(assistant_id: AssistantId, runtime: RuntimeDep) -> JSONResponse:
    """Every registered version of the agent, newest first."""
    load_assistant(runtime, assistant_id)
    found = [assistant_view(agent) for agent in _agents(runtime) if agent.id == assistant_id]
    return JSONResponse(list(reversed(found)))


@router.get("/assistants/{assistant_id}/graph", summary="An assistant's graph")
def graph(assistant_id: AssistantId, runtime: RuntimeDep) -> JSONResponse:
    """Not supported: an agent is a model-and-tools loop, not a graph of nodes."""
    load_assistant(runtime, assistant_id)
    raise NotSupportedError("drawing an assistant's graph")


@router.post("/assistants", summary="Create an assistant")
def create() -> JSONResponse:
    """Not supported: assistants are the server's agents."""
    raise NotSupportedError("creating assistants (they are the server's agents)")


__all__ = ["assistant_view", "load_assistant", "router"]
