"""A2A 1.0 for the agents of the HTTP API: each agent is an A2A agent at `/a2a/{agent_id}` (see docs/a2a.md)."""

from workers.api.a2a.server import A2A_PREFIX, guard_refusal, router

__all__ = ["A2A_PREFIX", "guard_refusal", "router"]
