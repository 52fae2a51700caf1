"""The LangGraph (Agent Protocol) API at the server's root: `/assistants`, `/threads`, `/runs`.

The unmodified `langgraph-sdk` clients (Python and JavaScript) work against it. It is a
view of the same runner, tenants and event log as `/v1`: an assistant is an agent, a
thread a conversation, a run a turn, an interrupt a suspension (see docs/langgraph.md).
"""

from fastapi import APIRouter

from workers.api.langgraph import assistants, crons, runs, threads, unsupported
from workers.api.openapi import error_responses

router = APIRouter(responses=error_responses(401, 422, 503))
router.include_router(assistants.router)
router.include_router(threads.router)
router.include_router(runs.router)
router.include_router(crons.router)
router.include_router(unsupported.router)

__all__ = ["router"]
