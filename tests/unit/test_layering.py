"""The daemon's wings import one way, and nothing imports in a circle.

`daemon/llmd` is split into wings (see the README's "Layout" and each subpackage's
``__init__``): cli -> api -> text -> runtime -> store, beside the worker process, over a few
leaf modules every wing may use. This walks every import statement of every module (module
level, inside functions and under ``TYPE_CHECKING`` alike, since each is a dependency a reader
has to follow) and fails on an arrow that points up the stack, between the two programs, or
round a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import llmd

PACKAGE = Path(llmd.__file__).resolve().parent

# Higher imports lower, never the other way round. The two programs (the `llmd` command line and
# the worker process) sit on top, side by side, and never import each other.
RANKS = {"store": 1, "runtime": 2, "text": 3, "api": 4, "cli": 5, "worker": 5}
LEAVES = {"llmd", "llmd.paths", "llmd.errors", "llmd.limits", "llmd._engine"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    found["llmd._engine"] = PACKAGE  # the native extension: a leaf with no imports of ours
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The llmd modules `module` imports, resolved to the longest known module name."""
    if path.is_dir():
        return set()
    is_package = path.name == "__init__.py"
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names += [f"{source}.{a.name}" for a in node.names] + [source]
    found = set()
    for name in names:
        if not (name == "llmd" or name.startswith("llmd.")):
            continue
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules and name != module:
            found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imported(m, p, modules) for m, p in modules.items()}


def _wing(module: str) -> str | None:
    if module == "llmd.__main__":  # `python -m llmd` is the command line
        return "cli"
    return None if module in LEAVES else module.split(".")[1]


def _rank(module: str) -> int:
    wing = _wing(module)
    return 0 if wing is None else RANKS[wing]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Arrows from a wing to a higher one, or between different wings of the same height."""
    wrong = []
    for source, targets in graph.items():
        for target in targets:
            if _wing(target) is None or _wing(target) == _wing(source):
                continue
            if _rank(target) >= _rank(source):
                wrong.append(f"{source} -> {target}")
    return sorted(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_every_module_belongs_to_a_wing_or_is_a_named_leaf() -> None:
    homeless = [m for m in _graph() if _wing(m) is not None and _wing(m) not in RANKS]
    assert not homeless, f"modules outside the wings (add them to a wing): {homeless}"


def test_imports_run_down_the_stack() -> None:
    upward = _upward(_graph())
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_a_planted_upward_import_and_cycle(tmp_path: Path) -> None:
    """The walk itself: an import inside a function and one under TYPE_CHECKING both count."""
    modules = {"llmd.store.a": tmp_path / "a.py", "llmd.api.b": tmp_path / "b.py"}
    modules["llmd.store.a"].write_text("def f():\n    from llmd.api.b import x\n")
    modules["llmd.api.b"].write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmd.store import a\n"
    )
    graph = {m: _imported(m, p, modules) for m, p in modules.items()}
    assert graph == {"llmd.store.a": {"llmd.api.b"}, "llmd.api.b": {"llmd.store.a"}}
    assert _upward(graph) == ["llmd.store.a -> llmd.api.b"]
    assert _cycles(graph) == [["llmd.api.b", "llmd.store.a"]]
