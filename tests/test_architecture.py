"""The dependency rule: workers -> store -> agent_runner, and a core that imports no infrastructure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_CORE = {"store", "workers", "celery", "kombu", "redis", "sqlalchemy", "psycopg", "alembic"}
FORBIDDEN_IN_STORE = {"workers", "celery", "kombu"}


def _imports(package: str) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(path, alias.name.split(".")[0]) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.module.split(".")[0]))
    return found


def test_core_imports_no_infrastructure() -> None:
    bad = [(str(p.relative_to(ROOT)), m) for p, m in _imports("agent_runner") if m in FORBIDDEN_IN_CORE]
    assert bad == []


def test_store_does_not_import_workers() -> None:
    bad = [(str(p.relative_to(ROOT)), m) for p, m in _imports("store") if m in FORBIDDEN_IN_STORE]
    assert bad == []


def test_importing_the_core_loads_no_infrastructure_module() -> None:
    # Given a fresh interpreter, when agent_runner is imported, then no infrastructure client is loaded.
    code = (
        "import sys, agent_runner; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'celery','kombu','redis','sqlalchemy','psycopg','alembic','openai','store','workers'}); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_every_public_name_imports_from_the_package_root() -> None:
    import agent_runner

    missing = [name for name in agent_runner.__all__ if not hasattr(agent_runner, name)]
    assert missing == []
    design_names = """Agent AgentUserInputTool AgentFormDefinition AgentToolContext AgentFormRequiredException
        ChatModel ChatRequest ChatResponse Usage RecoverableError ScriptedChatModel AgentTurn AgentTurnStatus Phase
        AgentSuspension SuspensionType AgentResumeCommand AgentRunner AgentStepResult AgentExecutionPolicy RetryPolicy
        Budget AgentEvent AgentEventType Middleware AgentRunnerError AgentConversationBusyException
        InvalidResumeCommand VersionConflictError TurnNotFound AgentNotFound FormProtocolError InMemoryAgentTurnStore
        InMemoryAgentLoader InMemoryChatMemory SystemMessage UserMessage AiMessage ToolMessage ToolCall tool
        AgentActionMessage AgentFormMessage ActionStatus ToolSpec AgentTurnStore AgentLoader ChatMemory
        ChatMemoryProvider""".split()
    assert [n for n in design_names if not hasattr(agent_runner, n)] == []


def test_the_core_has_no_import_cycle() -> None:
    from tests.helpers.shape import cycles

    assert [group for group in cycles() if group[0].startswith("agent_runner")] == []


def test_the_runners_collaborators_do_not_import_the_runner() -> None:
    # They work on a RunnerContext; the runner module only wires them together.
    from tests.helpers.shape import import_graph

    graph = import_graph()
    importers = sorted(m for m, targets in graph.items() if "agent_runner.runner" in targets)
    assert [m for m in importers if m.startswith(("agent_runner._runtime", "agent_runner.middleware"))] == []
