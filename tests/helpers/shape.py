"""Measures of the code's shape: module sizes, import cycles, private imports across packages.

`tests/test_architecture.py` holds the budgets; `python -m tests.helpers.shape` prints where
the code stands against them.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent_runner", "store", "workers")
MAX_MODULE_LINES = 700
EXEMPT_FROM_SIZE = ("store/migrations/",)


def modules(packages: tuple[str, ...] = PACKAGES, root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages under `root` by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def oversized(limit: int = MAX_MODULE_LINES, packages: tuple[str, ...] = PACKAGES, root: Path = ROOT) -> dict[str, int]:
    """Modules longer than `limit` lines (migrations aside) -> their length."""
    out: dict[str, int] = {}
    for path in modules(packages, root).values():
        relative = path.relative_to(root).as_posix()
        if relative.startswith(EXEMPT_FROM_SIZE):
            continue
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out[relative] = lines
    return out


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports run when the module loads, and those under `if TYPE_CHECKING:` (they tie modules all the same)."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.Try):
            stack.extend(node.body)
            stack.extend(node.orelse)
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    stack.extend(handler.body)


CYCLE_OK_MARKER = "# import-cycle-ok:"
"""Ends the line of a function-level import that may close a cycle, with the reason (a CLI's start-up import)."""


def _every_import(tree: ast.Module, source: str) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import of the module, in functions too, but those whose line carries `CYCLE_OK_MARKER`."""
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and CYCLE_OK_MARKER not in lines[node.lineno - 1]:
            yield node


def import_graph(
    packages: tuple[str, ...] = PACKAGES, root: Path = ROOT, *, function_level: bool = False
) -> dict[str, set[str]]:
    """Module -> the modules of the packages it imports at module level (with `function_level`, anywhere)."""
    known = modules(packages, root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
        found = _every_import(tree, source) if function_level else _module_level_imports(tree)
        for node in found:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, path, node)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                # `from pkg import mod` names a module; `from mod import name` the module itself.
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(packages: tuple[str, ...] = PACKAGES, root: Path = ROOT, *, function_level: bool = False) -> list[list[str]]:
    """The strongly connected groups of more than one module (each an import cycle), sorted.

    With `function_level`, the imports made inside functions count too: they tie the
    modules at run time all the same, only later.
    """
    graph = import_graph(packages, root, function_level=function_level)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def private_core_imports(
    packages: tuple[str, ...] = ("store", "workers"), root: Path = ROOT, *, of: str = "agent_runner"
) -> list[tuple[str, str]]:
    """(module, imported) for each import of a private module of `of` (`agent_runner._*`) from the packages."""
    out: list[tuple[str, str]] = []
    for name, path in modules(packages, root).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for imported in names:
                parts = imported.split(".")
                if parts[0] == of and any(p.startswith("_") and p != "__init__" for p in parts[1:2]):
                    out.append((name, imported))
                    break
    return sorted(set(out))


_BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def exception_classes(packages: tuple[str, ...] = PACKAGES, root: Path = ROOT) -> dict[str, str]:
    """Every exception class defined in the packages (migrations aside) -> its module.

    Read from the source: a class is an exception when one of its bases is a built-in exception
    or a class found so to be (by its last name, so `errors.ApiError` counts as `ApiError`).
    """
    bases: dict[str, tuple[str, set[str]]] = {}
    for name, path in modules(packages, root).items():
        if path.relative_to(root).as_posix().startswith(EXEMPT_FROM_SIZE):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                named = {ast.unparse(base).split(".")[-1].split("[")[0] for base in node.bases}
                bases[node.name] = (name, named)
    found: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for cls, (module, named) in bases.items():
            if cls not in found and named & (_BUILTIN_EXCEPTIONS | set(found)):
                found[cls] = module
                grew = True
    return dict(sorted(found.items()))


def reused_module_names(packages: tuple[str, ...] = PACKAGES, root: Path = ROOT) -> dict[str, list[str]]:
    """Module and package names that stand in more than one place (migrations aside) -> those places."""
    places: dict[str, list[str]] = {}
    for name, path in modules(packages, root).items():
        if "." not in name or path.relative_to(root).as_posix().startswith(EXEMPT_FROM_SIZE):
            continue
        places.setdefault(name.rsplit(".", 1)[1], []).append(name)
    return {short: sorted(names) for short, names in sorted(places.items()) if len(names) > 1}


def main() -> None:
    print("modules over", MAX_MODULE_LINES, "lines:")
    for path, lines in sorted(oversized().items(), key=lambda item: -item[1]):
        print(f"  {lines:5d} {path}")
    print("import cycles:")
    for group in cycles():
        print("  " + " <-> ".join(group))
    print("private agent_runner imports from store/workers:")
    for module, imported in private_core_imports():
        print(f"  {module}: {imported}")


if __name__ == "__main__":
    main()
