"""Retry schedules and sweep intervals in one place: code, then the deployment's configuration."""

from __future__ import annotations

import pytest

from agent_runner import Agent, AgentExecutionPolicy, DefinitionError, RetryPolicy
from workers.celery_app.config import celery_config
from workers.settings import SettingsError, WorkerSettings


class LedgerTimeout(Exception):
    """A transient error of some client library."""


def test_an_agent_keeps_its_own_retry_policy_unless_the_configuration_overrides_it() -> None:
    own = RetryPolicy(max_attempts=7, initial_backoff=3.0)
    careful = Agent(id="careful", retry=own)
    plain = Agent(id="plain")
    settings = WorkerSettings.from_env(
        {
            "AGENT_RUNNER_RETRY_MAX_ATTEMPTS": "2",
            "AGENT_RUNNER_RETRY_POLICIES": (
                '{"careful": {"max_backoff": 5}, '
                f'"plain": {{"max_attempts": 9, "retry_on": ["{__name__}:LedgerTimeout"]}}}}'
            ),
        }
    )
    policy = settings.policy()

    # The override changes only the fields it names, over the agent's own policy
    careful_retry = policy.retry_for(careful)
    assert (careful_retry.max_attempts, careful_retry.initial_backoff, careful_retry.max_backoff) == (7, 3.0, 5.0)
    # Over the deployment's defaults for an agent without a policy of its own
    plain_retry = policy.retry_for(plain)
    assert plain_retry.max_attempts == 9 and plain_retry.retry_on == (LedgerTimeout,)
    assert plain_retry.is_transient(LedgerTimeout()) and not plain_retry.is_transient(ConnectionError())
    # Agents without an override keep their own, or the defaults
    assert policy.retry_for(Agent(id="other", retry=own)) is own
    assert policy.retry_for(Agent(id="other")).max_attempts == 2


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "expected a JSON object"),
        ('["careful"]', "expected {"),
        ('{"careful": {"max_attempts": 0}}', "max_attempts"),
        ('{"careful": {"attempts": 3}}', "unknown fields"),
        ('{"careful": {"retry_on": "ConnectionError"}}', "retry_on is a list"),
        ('{"careful": {"retry_on": ["no_such_module:Error"]}}', "cannot import"),
        ('{"careful": {"retry_on": ["builtins:print"]}}', "not an exception class"),
    ],
)
def test_a_bad_retry_override_names_the_variable(value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message) as raised:
        WorkerSettings.from_env({"AGENT_RUNNER_RETRY_POLICIES": value})
    assert raised.value.variable == "AGENT_RUNNER_RETRY_POLICIES"


def test_a_policy_refuses_overrides_of_unknown_fields_in_code_too() -> None:
    with pytest.raises(DefinitionError, match="unknown fields"):
        AgentExecutionPolicy(retry_overrides={"a": {"tries": 2}})


def test_the_deadline_sweep_follows_the_sweep_interval_unless_it_has_its_own() -> None:
    assert WorkerSettings.from_env({"AGENT_RUNNER_SWEEP_INTERVAL_S": "4"}).deadline_sweep_interval_s == 4.0
    own = WorkerSettings.from_env(
        {"AGENT_RUNNER_SWEEP_INTERVAL_S": "4", "AGENT_RUNNER_DEADLINE_SWEEP_INTERVAL_S": "30"}
    )
    entries = celery_config(own)["beat_schedule"]
    assert entries["agent-runner-sweep-deadlines"]["schedule"] == 30.0
    assert entries["agent-runner-sweep-inbox"]["schedule"] == 4.0


def test_the_deadline_reminder_fraction_reaches_the_policy_and_zero_turns_it_off() -> None:
    assert WorkerSettings.from_env({}).policy().deadline_reminder == 0.8
    assert WorkerSettings.from_env({"AGENT_RUNNER_DEADLINE_REMINDER": "0.5"}).policy().deadline_reminder == 0.5
    assert WorkerSettings.from_env({"AGENT_RUNNER_DEADLINE_REMINDER": "0"}).policy().deadline_reminder is None
    with pytest.raises(SettingsError, match="AGENT_RUNNER_DEADLINE_REMINDER"):
        WorkerSettings.from_env({"AGENT_RUNNER_DEADLINE_REMINDER": "1"})


def test_a_runner_built_from_the_settings_retries_as_the_override_says() -> None:
    from agent_runner import AgentRunner, AgentTurnStatus, AiMessage, ScriptedChatModel, ToolCall, tool

    @tool
    def read_ledger() -> str:
        """Read the ledger."""
        raise LedgerTimeout("ledger slow")

    def agent(agent_id: str) -> Agent:
        call = AiMessage(tool_calls=[ToolCall(id="r1", name="read_ledger", arguments={})])
        return Agent(id=agent_id, chat_model=ScriptedChatModel([call]), tools=[read_ledger])

    settings = WorkerSettings.from_env(
        {"AGENT_RUNNER_RETRY_POLICIES": f'{{"patient": {{"retry_on": ["{__name__}:LedgerTimeout"]}}}}'}
    )
    runner = AgentRunner(policy=settings.policy())

    # The overridden agent treats the client's timeout as transient; the other fails at once
    assert runner.run(agent("patient"), "read it").status is AgentTurnStatus.RETRY_SCHEDULED
    assert runner.run(agent("hasty"), "read it").status is AgentTurnStatus.FAILED
