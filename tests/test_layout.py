"""The test tree is one package, imported by full module paths.

Every folder of `tests/` is a package, so mypy checks it and modules are named by their
path (`tests.unit.agent_runner.turn_kit`). Tests share code through helper modules, never
by importing another test module: a helper used by one folder lives beside its tests,
one used by several folders lives in `tests/helpers/`.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _python_files() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def _imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, as written (relative imports resolved against its package)."""
    package = path.relative_to(TESTS.parent).with_suffix("").parts[:-1]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.append(module)
            # `from tests.x import test_y` imports a module too
            found += [f"{module}.{alias.name}" for alias in node.names]
    return found


def test_every_folder_with_python_files_is_a_package() -> None:
    folders = {path.parent for path in _python_files()}
    missing = sorted(
        str(folder.relative_to(TESTS.parent)) for folder in folders if not (folder / "__init__.py").exists()
    )
    assert missing == [], "add an empty __init__.py to each"


def test_no_module_imports_a_test_module() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)} imports {module}"
        for path in _python_files()
        for module in _imported_modules(path)
        if module.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert offenders == [], "move the shared code into a helper module"


def test_helpers_are_imported_by_their_package_path() -> None:
    # A bare `import turn_kit` works only when the helper's folder is on sys.path, which
    # pytest (importlib mode) and the worker processes the tests start do not arrange.
    helpers = {path.stem for path in _python_files() if not path.stem.startswith(("test_", "__init__", "conftest"))}
    offenders = [
        f"{path.relative_to(TESTS.parent)} imports {module}"
        for path in _python_files()
        for module in _imported_modules(path)
        if module.split(".", 1)[0] in helpers
    ]
    assert offenders == [], "import helpers as tests.<folder>.<module>"
