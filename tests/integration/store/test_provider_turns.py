"""A turn on each provider adapter through the runner on SQLite and PostgreSQL, finished by another process.

The turn meets an overloaded provider (a retry), a form, and an approval; a second Python
process loads the snapshot from the database, approves, and the model's last call carries
the provider parts of both reasoned steps back verbatim.
"""

from __future__ import annotations

import pytest

import store
from agent_runner import AgentResumeCommand, AgentTurnStatus, AiMessage, SuspensionType
from tests.helpers import provider_turns as scenario
from tests.helpers.fake_openai import FakeChatServer
from tests.helpers.processes import run_module

S = AgentTurnStatus


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


@pytest.mark.parametrize("provider", scenario.PROVIDERS)
def test_a_turn_with_a_retry_a_form_and_an_approval_resumes_in_another_process(provider: str, store_url: str) -> None:
    server = FakeChatServer()
    server.add(*scenario.script(provider))
    try:
        with store.SqlAgentTurnStore(store_url) as turns:
            runner, agent = scenario.runner_for(provider, server.root_url, turns)
            # Given the provider overloaded on the first call: the turn is scheduled for a retry
            turn = runner.run(agent, "Ship O-1, then deploy web")
            assert turn.status is S.RETRY_SCHEDULED
            # When it is retried, the model calls `ship`, which asks for the address
            turn = runner.resume(turn.id, AgentResumeCommand.retry())
            assert turn.status is S.WAITING_FOR_USER
            assert turn.suspension is not None and turn.suspension.type is SuspensionType.USER_INPUT
            # And once the form is submitted, the model calls `deploy`, which waits for approval
            ship_call = scenario.SHIP_CALL[provider]
            turn = runner.resume(turn.id, AgentResumeCommand.user_input(ship_call, scenario.ADDRESS))
            assert turn.status is S.WAITING_FOR_APPROVAL
            # The snapshot as stored holds the provider parts of both reasoned steps
            reasoned = [m for m in turns.load(turn.id).messages if isinstance(m, AiMessage) and m.provider_parts]
            assert len(reasoned) == 2
        # When another process loads the turn from the database and approves
        deploy_call = scenario.DEPLOY_CALL[provider]
        finished = run_module(
            "tests.helpers.provider_turns", provider, store_url, server.root_url, turn.id, deploy_call
        )
        assert finished.returncode == 0, finished.stderr
        # Then the turn completed there, and its last call sent both steps' parts back as received
        assert finished.stdout.split(maxsplit=1) == ["COMPLETED", "Shipped and deployed.\n"]
        assert len(server.requests) == 4
        assert scenario.carried_back(provider, server.requests[3].body) == scenario.expected_carried_back(provider)
        with store.SqlAgentTurnStore(store_url) as turns:
            done = turns.load(turn.id)
        assert done.status is S.COMPLETED
        results = [m.content for m in done.messages if m.role == "tool"]
        assert results == ["shipped O-1 to Main St 1", "deployed web"]
    finally:
        server.close()
