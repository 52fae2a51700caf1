"""The dependency rule: workers -> store -> agent_runner, and a core that imports no infrastructure."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import shape

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_CORE = {"store", "workers", "celery", "kombu", "redis", "sqlalchemy", "psycopg", "alembic"}
FORBIDDEN_IN_STORE = {"workers", "celery", "kombu"}
RUNNER_FACADE_LINES = 400


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


def test_the_exported_names_are_the_pinned_ones() -> None:
    # A public name added or removed is a decision: make it here too (tests/public_names.json).
    import agent_runner
    import store
    import workers

    pinned = json.loads((ROOT / "tests" / "public_names.json").read_text())
    exported = {"agent_runner": agent_runner.__all__, "store": store.__all__, "workers": workers.__all__}
    assert {package: sorted(names) for package, names in exported.items()} == pinned
    assert all(len(set(names)) == len(names) for names in exported.values())


def test_no_module_is_over_the_size_budget() -> None:
    # A module past the budget has taken a second job: give that job a module of its own.
    assert shape.oversized() == {}


def test_the_runner_module_is_only_the_facade() -> None:
    lines = len((ROOT / "agent_runner" / "runner.py").read_text().splitlines())
    assert lines <= RUNNER_FACADE_LINES


def test_no_import_cycle_between_modules() -> None:
    # Module-level imports, TYPE_CHECKING ones included: a cycle ties modules however it is hidden.
    assert shape.cycles() == []


def test_no_import_cycle_even_counting_imports_made_in_functions() -> None:
    # A function-level import only delays a cycle; a CLI's start-up import may be marked
    # with `# import-cycle-ok: <reason>`.
    assert shape.cycles(function_level=True) == []


def test_store_and_workers_import_no_private_core_module() -> None:
    assert shape.private_core_imports() == []


def test_workers_import_no_private_store_module() -> None:
    assert shape.private_core_imports(("workers",), of="store") == []


def test_the_runners_collaborators_do_not_import_the_runner() -> None:
    # They work on a RunnerContext; the runner module only wires them together.
    graph = shape.import_graph()
    importers = sorted(m for m, targets in graph.items() if "agent_runner.runner" in targets)
    assert [m for m in importers if m.startswith(("agent_runner._runtime", "agent_runner.middleware"))] == []


def test_the_shape_checks_see_what_they_look_for(tmp_path: Path) -> None:
    # Given a package with a cycle hidden under TYPE_CHECKING, a long module, and a private core import
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import B\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nB = 1\n" + "x = 1\n" * 700
    )
    (package / "c.py").write_text(
        "from agent_runner._base import FrozenModel\nfrom . import a\n\n\ndef late():\n    from store._engine import x\n"
    )
    # and cycles closed only inside functions, one of them marked as allowed
    (package / "d.py").write_text("def f():\n    from pkg import e\n")
    (package / "e.py").write_text("from pkg import d\n")
    (package / "f.py").write_text("def f():\n    from pkg import g  # import-cycle-ok: start-up\n")
    (package / "g.py").write_text("from pkg import f\n")
    # Then each check finds it
    assert shape.cycles(("pkg",), tmp_path) == [["pkg.a", "pkg.b"]]
    assert shape.oversized(packages=("pkg",), root=tmp_path) == {"pkg/b.py": 704}
    assert shape.private_core_imports(("pkg",), tmp_path) == [("pkg.c", "agent_runner._base")]
    assert shape.private_core_imports(("pkg",), tmp_path, of="store") == [("pkg.c", "store._engine")]
    assert shape.cycles(("pkg",), tmp_path, function_level=True) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.e"]]
    assert shape.import_graph(("pkg",), tmp_path)["pkg.c"] == {"pkg.a"}


def _recipes() -> dict[str, tuple[list[str], list[str]]]:
    """The change recipes of docs/architecture.md: title -> (the file each step changes, every path named)."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Where does a change go", 1)[1]
    recipes: dict[str, tuple[list[str], list[str]]] = {}
    title = ""
    for line in text.splitlines():
        if line.startswith("**"):
            title = line.split("**")[1]
            recipes[title] = ([], [])
        elif title:
            tokens = re.findall(r"`([^`\s]+)`", line)
            paths = [t for t in tokens if "/" in t or t.endswith((".py", ".toml", ".json"))]
            if re.match(r"\d+\. `", line) and tokens:
                recipes[title][0].append(tokens[0])  # a step starts with the file it changes
            recipes[title][1].extend(paths)
    return recipes


def test_each_change_recipe_names_paths_that_exist_and_touches_at_most_five_files() -> None:
    recipes = _recipes()
    assert len(recipes) >= 7
    for title, (steps, paths) in recipes.items():
        for path in paths:
            # `<name>` stands for what the change creates: the folder it goes in must exist
            concrete = path.split("<", 1)[0] if "<" in path else path
            assert (ROOT / concrete).exists(), f"{title!r} names {path!r}, which is not in the repository"
        changed = [step for step in steps if not step.startswith("tests/")]
        assert steps and len(changed) <= 5, f"{title!r} changes {len(changed)} files: {changed}"


EXCEPTIONS_NOT_ENDING_IN_ERROR = {
    # The names DESIGN.md fixes: code outside the project catches them by these names.
    "AgentConversationBusyException": "fixed by DESIGN.md",
    "AgentFormRequiredException": "fixed by DESIGN.md",
    "AgentNotFound": "fixed by DESIGN.md",
    "InvalidResumeCommand": "fixed by DESIGN.md",
    "TurnNotFound": "fixed by DESIGN.md",
    # Control-flow signals are named for the condition (STYLE.md), not as errors.
    "CancelledMidCall": "a signal that stops a streaming model call whose turn was cancelled",
    "OperationPending": "a signal from a tool: its call started work elsewhere that is not done yet",
}
"""Exception classes that keep a name without the `Error` suffix, each with its reason; it only shrinks."""


def test_exception_classes_end_in_error_unless_a_reason_keeps_their_name() -> None:
    found = shape.exception_classes()
    assert len(found) > 40  # the scan sees the error tree
    unsuffixed = {name for name in found if not name.endswith("Error")}
    assert unsuffixed == set(EXCEPTIONS_NOT_ENDING_IN_ERROR)


def test_the_name_checks_see_what_they_look_for(tmp_path: Path) -> None:
    # Given a package with exceptions by inheritance through another module, and a reused module name
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for init in ("pkg/__init__.py", "pkg/sub/__init__.py"):
        (tmp_path / init).write_text("")
    (tmp_path / "pkg" / "errors.py").write_text("class BaseProblem(ValueError): ...\nclass Plain: ...\n")
    (tmp_path / "pkg" / "sub" / "errors.py").write_text(
        "from pkg import errors\nclass Missing(errors.BaseProblem): ...\nclass GoneError(Missing): ...\n"
    )
    # Then each check finds them
    assert shape.exception_classes(("pkg",), tmp_path) == {
        "BaseProblem": "pkg.errors",
        "GoneError": "pkg.sub.errors",
        "Missing": "pkg.sub.errors",
    }
    assert shape.reused_module_names(("pkg",), tmp_path) == {"errors": ["pkg.errors", "pkg.sub.errors"]}


MODULE_NAMES_FOR_ONE_JOB_IN_TWO_LAYERS = {
    "app": (
        ["workers.api.app", "workers.app"],
        "the application object of a process: the HTTP server's `create_app`, the `celery -A workers.app` entry",
    ),
    "context": (
        ["agent_runner._runtime.context", "workers.cli.context"],
        "what the functions of one layer share: the runner's `RunnerContext`, the commands' context",
    ),
    "crons": (["store.crons", "workers.api.langgraph.crons"], "the LangGraph API's crons: their records, their routes"),
    "errors": (["agent_runner.errors", "workers.api.errors"], "the core's error tree, and the HTTP answers to it"),
    "inbox": (
        ["store.inbox", "workers.inbox"],
        "the inbox: its queued messages (DESIGN.md's `store.Inbox`), and the starting of turns from them",
    ),
    "middleware": (
        ["agent_runner.middleware", "workers.celery_app.middleware", "workers.telemetry.middleware"],
        "the core's `Middleware` extension point, and the middleware the workers and the telemetry add",
    ),
    "schedules": (
        ["workers.cli.schedules", "workers.schedules"],
        "scheduled turns, and the `agent-runner schedules` command over them (a CLI module is named for its command)",
    ),
    "threads": (
        ["store.threads", "workers.api.langgraph.threads"],
        "the LangGraph API's threads: their records, their routes",
    ),
    "turns": (
        ["store.turns", "workers.cli.turns"],
        "the SQL turn store, and the `agent-runner turns` command over turns (a CLI module is named for its command)",
    ),
}
"""Module names that stand in two places for one job, each with its reason; any other name means one module."""


def test_a_module_name_means_one_job_in_the_whole_repository() -> None:
    # `inbox` in two packages for two jobs makes a reader open both to know which is meant.
    reused = shape.reused_module_names()
    allowed = {name: places for name, (places, _) in MODULE_NAMES_FOR_ONE_JOB_IN_TWO_LAYERS.items()}
    assert reused == allowed
