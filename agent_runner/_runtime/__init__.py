"""The runner's collaborators: what `AgentRunner` does, one job per module.

Each works on a `RunnerContext` (the store, the agent loader, the policy, the listeners,
the projection, the per-thread state...) rather than on the runner, so none of them
depends on `agent_runner.runner`, which only wires them together behind the public API.
"""
