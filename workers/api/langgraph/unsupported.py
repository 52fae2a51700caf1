"""Parts of the LangGraph API this server does not offer, each answered with a 501 naming it.

Without these routes a client calling them would get a bare 404 that says nothing about
why; the table says what is missing, once, and docs/langgraph.md says why.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Depends

from workers.api.auth import get_tenant
from workers.api.langgraph.mapping import NotSupportedError

UNSUPPORTED: tuple[tuple[str, str, str], ...] = (
    ("POST", "/runs/batch", "creating runs in a batch"),
    ("POST", "/runs/cancel", "cancelling several runs at once"),
    ("POST", "/threads/prune", "pruning threads"),
    ("POST", "/threads/{thread_id}/copy", "copying a thread"),
    ("POST", "/threads/{thread_id}/state/checkpoint", "reading a thread's state at a checkpoint"),
    ("GET", "/threads/{thread_id}/stream", "a thread's own event stream (join a run's stream instead)"),
    ("PATCH", "/assistants/{assistant_id}", "changing an assistant (assistants are the server's agents)"),
    ("DELETE", "/assistants/{assistant_id}", "deleting an assistant (assistants are the server's agents)"),
    ("POST", "/assistants/{assistant_id}/latest", "choosing an assistant's version (agents choose their own)"),
    ("GET", "/assistants/{assistant_id}/subgraphs", "listing an assistant's subgraphs"),
    ("GET", "/assistants/{assistant_id}/subgraphs/{namespace}", "listing an assistant's subgraphs"),
    ("PUT", "/store/items", "the key-value store"),
    ("GET", "/store/items", "the key-value store"),
    ("DELETE", "/store/items", "the key-value store"),
    ("POST", "/store/items/search", "the key-value store"),
    ("POST", "/store/namespaces", "the key-value store"),
)
"""`(method, path, what is not supported)`."""

router = APIRouter(tags=["langgraph"], dependencies=[Depends(get_tenant)], include_in_schema=False)


def _refuse(what: str) -> Callable[[], None]:
    def refuse() -> None:
        raise NotSupportedError(what)

    return refuse


for method, path, what in UNSUPPORTED:
    router.add_api_route(path, _refuse(what), methods=[method], summary=f"Not supported: {what}")
