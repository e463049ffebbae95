"""The Python package's import graph: no module imports another that (directly or not) imports
it back, and none takes a private name from another (``_core``, the extension, aside). Read
from the sources with ast, so imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = next(p / "python" / "metalqwen" for p in Path(__file__).resolve().parents
               if (p / "python" / "metalqwen" / "__init__.py").is_file())
EXTENSIONS = {"metalqwen._core"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> list[tuple[str, str]]:
    """(module imported, name taken from it or "") for every metalqwen import in ``path``."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "metalqwen"]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module] if node.module else
                            package[: len(package) - node.level + 1]) if node.level else node.module
            if base.split(".")[0] != "metalqwen":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub, "") if sub in modules else (base, alias.name))
    return found


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """module -> the metalqwen modules it imports; and every private name taken across modules."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths} | EXTENSIONS
    graph, private = {}, []
    for path in paths:
        name = _module_name(path)
        graph[name] = set()
        for module, taken in _imports(path, modules):
            if module != name:
                graph[name].add(module)
            if taken.startswith("_") and not taken.startswith("__") and module not in EXTENSIONS and module != name:
                private.append(f"{name} imports {module}.{taken}")
    return graph, private


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    graph, _ = _graph()
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    assert {"metalqwen.model", "metalqwen.batching", "metalqwen.checkpoint"} <= set(graph)  # the graph was read


def test_the_cycle_finder_finds_one():
    graph, _ = _graph()
    graph["metalqwen.speculative"].add("metalqwen.model")  # model imports speculative: a cycle
    assert _cycle(graph) is not None


def test_no_module_takes_another_modules_private_names():
    _, private = _graph()
    assert private == []


if __name__ == "__main__":  # prints the graph: module -> what it imports
    graph, _ = _graph()
    for module in sorted(graph):
        print(f"{module} -> {', '.join(sorted(d.removeprefix('metalqwen.') for d in graph[module])) or '-'}")
