"""Worker settings from the environment: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from agent_runner import Agent, AgentRunnerError, InMemoryAgentLoader
from workers.agents import load_agent_loader
from workers.celery_app.config import celery_config
from workers.settings import SettingsError, WorkerSettings


def test_defaults_work_with_nothing_set() -> None:
    settings = WorkerSettings.from_env({})
    assert settings.database_url == "sqlite:///./agent_runner.db"
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.broker_url == settings.redis_url
    assert settings.queue == "agent-runner"
    assert (settings.lease_ttl_s, settings.sweep_interval_s, settings.max_eta_s) == (30.0, 10.0, 300.0)
    assert settings.steps_per_task == 16
    assert settings.agent_loader is None and settings.inbox_agent is None


def test_the_broker_defaults_to_the_redis_url_and_can_be_set_apart() -> None:
    assert WorkerSettings.from_env({"AGENT_RUNNER_REDIS_URL": "redis://r:6379/2"}).broker_url == "redis://r:6379/2"
    amqp = "amqp://guest:guest@127.0.0.1:5672//"
    assert WorkerSettings.from_env({"CELERY_BROKER_URL": amqp}).broker_url == amqp


def test_values_are_parsed_and_empty_ones_count_as_unset() -> None:
    settings = WorkerSettings.from_env(
        {
            "AGENT_RUNNER_LEASE_TTL_S": "2.5",
            "AGENT_RUNNER_STEPS_PER_TASK": "5",
            "AGENT_RUNNER_QUEUE": "turns.high",
            "AGENT_RUNNER_AGENT_LOADER": "myapp.agents:loader",
            "AGENT_RUNNER_INBOX_AGENT": "",
            "AGENT_RUNNER_RETRY_MAX_ATTEMPTS": "5",
        }
    )
    assert settings.lease_ttl_s == 2.5 and settings.lease_ttl_ms == 2500
    assert settings.steps_per_task == 5
    assert settings.queue == "turns.high"
    assert settings.agent_loader == "myapp.agents:loader"
    assert settings.inbox_agent is None
    assert settings.policy().retry.max_attempts == 5


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENT_RUNNER_LEASE_TTL_S", "soon"),
        ("AGENT_RUNNER_LEASE_TTL_S", "0"),
        ("AGENT_RUNNER_SWEEP_INTERVAL_S", "nan"),
        ("AGENT_RUNNER_STEPS_PER_TASK", "2.5"),
        ("AGENT_RUNNER_STEPS_PER_TASK", "0"),
        ("AGENT_RUNNER_QUEUE", "has space"),
        ("AGENT_RUNNER_AGENT_LOADER", "no_colon"),
        ("AGENT_RUNNER_DATABASE_URL", "agent_runner.db"),
        ("CELERY_BROKER_URL", "localhost"),
        ("AGENT_RUNNER_RETRY_JITTER", "2"),
        ("AGENT_RUNNER_MAX_ETA_S", "2000"),
        ("AGENT_RUNNER_TASK_TIME_LIMIT_S", "4000"),
        ("AGENT_RUNNER_TASK_SOFT_TIME_LIMIT_S", "800"),
    ],
)
def test_a_bad_value_raises_an_error_naming_its_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as raised:
        WorkerSettings.from_env({variable: value})
    assert raised.value.variable == variable
    assert variable in str(raised.value)
    assert isinstance(raised.value, AgentRunnerError)


def test_the_celery_config_is_json_only_late_acking_and_sweeps_on_the_interval() -> None:
    settings = WorkerSettings.from_env({"AGENT_RUNNER_SWEEP_INTERVAL_S": "7", "AGENT_RUNNER_QUEUE": "q1"})
    config = celery_config(settings)
    assert config["accept_content"] == ["json"]
    assert config["task_serializer"] == config["result_serializer"] == "json"
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert config["worker_prefetch_multiplier"] == 1
    assert config["task_ignore_result"] and config["result_backend"] is None
    assert config["task_default_queue"] == "q1"
    assert config["broker_transport_options"]["visibility_timeout"] == 3600.0
    assert config["task_soft_time_limit"] < config["task_time_limit"] < 3600.0
    schedule = config["beat_schedule"]
    assert {entry["task"] for entry in schedule.values()} == {
        "agent_runner.sweep_inbox",
        "agent_runner.sweep_stale_turns",
        "agent_runner.sweep_due_retries",
        "agent_runner.sweep_deadlines",
    }
    # Every sweep runs on the interval (the deadline sweep too, unless it has its own).
    assert all(entry["schedule"] == 7.0 and entry["options"]["queue"] == "q1" for entry in schedule.values())


def test_the_broker_key_prefix_applies_to_redis_brokers_only() -> None:
    redis = celery_config(WorkerSettings.from_env({"AGENT_RUNNER_BROKER_KEY_PREFIX": "tenant-a:"}))
    assert redis["broker_transport_options"]["global_keyprefix"] == "tenant-a:"
    amqp = celery_config(
        WorkerSettings.from_env({"AGENT_RUNNER_BROKER_KEY_PREFIX": "tenant-a:", "CELERY_BROKER_URL": "amqp://h//"})
    )
    assert "global_keyprefix" not in amqp["broker_transport_options"]


NOT_AGENTS = "sample"
AGENT = Agent(id="sample")
AGENTS = [AGENT, Agent(id="other")]
LOADER = InMemoryAgentLoader([AGENT])


def make_agents() -> list[Agent]:
    return AGENTS


def broken() -> list[Agent]:
    raise RuntimeError("no agents today")


@pytest.mark.parametrize("attribute", ["AGENT", "AGENTS", "LOADER", "make_agents", "InMemoryAgentLoader"])
def test_the_agent_loader_accepts_a_loader_agents_or_a_function(attribute: str) -> None:
    loader = load_agent_loader(f"{__name__}:{attribute}")
    if attribute != "InMemoryAgentLoader":
        assert loader.load("sample") is AGENT


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("no_such_module_here:x", "cannot import"),
        (f"{__name__}:missing", "no attribute"),
        (f"{__name__}:broken", "RuntimeError"),
        (f"{__name__}:NOT_AGENTS", "expected an AgentLoader"),
    ],
)
def test_an_unusable_agent_loader_is_a_settings_error(spec: str, reason: str) -> None:
    with pytest.raises(SettingsError, match=reason) as raised:
        load_agent_loader(spec)
    assert raised.value.variable == "AGENT_RUNNER_AGENT_LOADER"


def test_importing_workers_loads_neither_celery_nor_the_store() -> None:
    import subprocess
    import sys

    code = "import sys, workers; print(sorted(m for m in sys.modules if m.split('.')[0] in {'celery', 'store', 'sqlalchemy', 'redis'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
