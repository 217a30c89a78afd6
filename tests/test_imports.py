"""The package's import graph has no cycle, not even through imports inside
functions or ``if TYPE_CHECKING:`` blocks (a type-only import is still a
dependency a reader follows): each module can be read, and tested, below the
ones it uses."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted((ROOT / "fedsim").rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "fedsim"
        ):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # imports inside ``if TYPE_CHECKING:`` count: a type is a dependency too
    known = _modules()
    graph = {m: _imports(p, known) - {m} for m, p in known.items()}
    assert _cycles(graph) == []


def test_type_checking_imports_are_counted(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from fedsim.scenario import Scenario\n"
    )
    assert _imports(module, {"fedsim.scenario": module}) == {"fedsim.scenario"}


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_function_is_over_80_lines():
    long = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 80:
                    long.append(f"{module}.{node.name}: {n} lines")
    assert long == []


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {m: _imports(p, known) - {m} for m, p in known.items()}


def _in(module: str, wing: str) -> bool:
    return module == wing or module.startswith(wing + ".")


def test_nothing_outside_the_commands_wing_imports_it():
    # fedsim.tools (cli, compare, stress, report, ...) sits on top: the core
    # and the Ray layer must run, and be tested, without any command
    # (``python -m fedsim`` is the command line's own door)
    bad = sorted(
        f"{m} -> {d}"
        for m, deps in _graph().items()
        if not _in(m, "fedsim.tools") and m != "fedsim.__main__"
        for d in deps
        if _in(d, "fedsim.tools")
    )
    assert bad == []


def test_only_the_runtime_and_the_commands_import_the_ray_wing():
    # fedsim.remote is everything Ray; the core reaches it through the
    # runtime alone, so a reader of the core never meets an actor
    allowed = ("fedsim.runtime", "fedsim.remote", "fedsim.tools")
    bad = sorted(
        f"{m} -> {d}"
        for m, deps in _graph().items()
        if not any(_in(m, a) for a in allowed)
        for d in deps
        if _in(d, "fedsim.remote")
    )
    assert bad == []


def _unit(module: str) -> str:
    """A module's folder (``fedsim.algorithms``) or, at the top, itself."""
    return ".".join(module.split(".")[:2])


def test_no_two_folders_or_a_folder_and_a_module_import_each_other():
    # a folder (algorithms/, selectors/, data/, ...) is read as one unit:
    # if it imported a unit that imports it back, neither could be read,
    # or tested, below the other (type-only imports count, as above)
    edges = {
        (_unit(m), _unit(d))
        for m, deps in _graph().items()
        for d in deps
        if _unit(m) != _unit(d)
    }
    both = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert both == []
