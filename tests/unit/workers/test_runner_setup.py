"""`AGENT_RUNNER_SETUP`: one function that adds listeners and middleware to every runner the project builds."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from agent_runner import AgentEvent, AgentRunner, Middleware
from workers.agents import apply_runner_setup, load_runner_setup
from workers.settings import SettingsError, WorkerSettings

SEEN: list[AgentEvent] = []


class Marker(Middleware):
    pass


def setup(runner: AgentRunner) -> None:
    runner.add_event_listener(SEEN.append)
    runner.middleware.append(Marker())


def broken(runner: AgentRunner) -> None:
    raise RuntimeError("no listeners today")


@pytest.fixture
def plugin_module() -> Iterator[str]:
    module = types.ModuleType("runner_setup_plugin")
    module.setup = setup  # type: ignore[attr-defined]
    module.broken = broken  # type: ignore[attr-defined]
    module.not_callable = 42  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield module.__name__
    finally:
        del sys.modules[module.__name__]


def test_the_setting_is_read_from_the_environment() -> None:
    settings = WorkerSettings.from_env({"AGENT_RUNNER_SETUP": "my_app.observability:setup"})
    assert settings.runner_setup == "my_app.observability:setup"
    assert WorkerSettings.from_env({}).runner_setup is None


def test_the_setup_function_adds_listeners_and_middleware(plugin_module: str) -> None:
    SEEN.clear()
    runner = apply_runner_setup(AgentRunner(), f"{plugin_module}:setup")
    assert any(isinstance(m, Marker) for m in runner.middleware)
    from agent_runner import AiMessage, ScriptedChatModel
    from agent_runner.agent import Agent

    runner.run(Agent(id="a", chat_model=ScriptedChatModel([AiMessage(content="hi")])), "hello")
    assert [e.type.value for e in SEEN][-1] == "TURN_COMPLETED"


def test_no_setting_changes_nothing() -> None:
    runner = AgentRunner()
    assert apply_runner_setup(runner, None) is runner
    assert load_runner_setup(None) is None


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("missing_function", "has no attribute"),
        ("not_callable", "expected a function taking the runner, got int"),
        ("broken", "calling it raised RuntimeError: no listeners today"),
    ],
)
def test_a_bad_setup_is_a_settings_error_naming_the_variable(plugin_module: str, attribute: str, message: str) -> None:
    with pytest.raises(SettingsError, match="AGENT_RUNNER_SETUP") as caught:
        apply_runner_setup(AgentRunner(), f"{plugin_module}:{attribute}")
    assert message in str(caught.value)


def test_an_unimportable_module_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="cannot import module 'no_such_module_here'"):
        load_runner_setup("no_such_module_here:setup")
