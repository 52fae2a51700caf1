"""What a deployment plugs in by `module:attribute`: its agents and its runner set-up.

`AGENT_RUNNER_AGENT_LOADER` names the agents; `AGENT_RUNNER_SETUP` names a function called
with every runner the project builds (Celery worker processes of any pool, `build_runner()`
in a web app, the HTTP server, the CLI), where a deployment adds its event listeners and
middleware once for all of them. One resolution for every process: they accept the same
values and report the same errors.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agent_runner import Agent, AgentLoader, AgentRunner, InMemoryAgentLoader
from workers.settings import SettingsError

LOADER_VARIABLE = "AGENT_RUNNER_AGENT_LOADER"
SETUP_VARIABLE = "AGENT_RUNNER_SETUP"

RunnerSetup = Callable[[AgentRunner], None]
"""A function that adds event listeners and middleware to a runner the project built."""


def _import_attribute(spec: str, variable: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SettingsError(variable, spec, "expected module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SettingsError(variable, spec, f"cannot import module {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise SettingsError(variable, spec, f"{module_name!r} has no attribute {attribute!r}") from None
    return target


def load_agent_loader(spec: str | None) -> AgentLoader:
    """Resolve `module:attribute` to an `AgentLoader`; an empty in-memory loader when `spec` is None.

    The attribute may be an `AgentLoader`, an `Agent`, a list of `Agent`s, or a function
    (or class) called without arguments that returns one of those. Dotted attributes
    (`module:holder.agents`) are followed.

    Raises:
        SettingsError: The spec is malformed, the module or attribute cannot be imported,
            or it is none of the above. The error names `AGENT_RUNNER_AGENT_LOADER`.
    """
    if spec is None:
        return InMemoryAgentLoader()
    return _as_loader(_import_attribute(spec, LOADER_VARIABLE), spec, call=True)


def load_runner_setup(spec: str | None) -> RunnerSetup | None:
    """Resolve `module:function` (`AGENT_RUNNER_SETUP`) to the set-up function; None when `spec` is None.

    Raises:
        SettingsError: The spec cannot be imported or does not name a callable.
    """
    if spec is None:
        return None
    target = _import_attribute(spec, SETUP_VARIABLE)
    if not callable(target):
        raise SettingsError(SETUP_VARIABLE, spec, f"expected a function taking the runner, got {type(target).__name__}")
    setup: RunnerSetup = target
    return setup


def apply_runner_setup(runner: AgentRunner, spec: str | None) -> AgentRunner:
    """Call the `AGENT_RUNNER_SETUP` function on `runner` (if one is configured) and return the runner.

    Raises:
        SettingsError: The spec cannot be resolved, or the function raised.
    """
    setup = load_runner_setup(spec)
    if setup is not None:
        try:
            setup(runner)
        except Exception as exc:
            raise SettingsError(SETUP_VARIABLE, spec, f"calling it raised {type(exc).__name__}: {exc}") from exc
    return runner


def _as_loader(target: Any, spec: str, *, call: bool) -> AgentLoader:
    if isinstance(target, Agent):
        return InMemoryAgentLoader([target])
    if isinstance(target, list | tuple) and target and all(isinstance(item, Agent) for item in target):
        return InMemoryAgentLoader(target)
    # A class has a `load` attribute too: only an instance is a loader.
    if not isinstance(target, type) and isinstance(target, AgentLoader):
        return target
    if call and callable(target):
        try:
            made = target()
        except Exception as exc:
            raise SettingsError(LOADER_VARIABLE, spec, f"calling it raised {type(exc).__name__}: {exc}") from exc
        return _as_loader(made, spec, call=False)
    raise SettingsError(
        LOADER_VARIABLE, spec, f"expected an AgentLoader, an Agent or a list of Agents, got {type(target).__name__}"
    )
