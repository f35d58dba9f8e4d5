"""The stages depend on each other one way: every module imports on its own, each stage imports only the floors
below it (the kernels and the batch schema under pack, augment and loader), and no chain of imports (lazy ones,
inside functions, included) leads from a stage, or from a module, back to itself."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "yolofeed"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (packages by their ``__init__``)."""
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _stage(module: str) -> str | None:
    """``yolofeed.monitor.steps`` -> ``monitor``; ``yolofeed.cli`` -> ``cli``; the package facade -> None."""
    parts = module.split(".")
    return None if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def stage_graph() -> dict[str, set[str]]:
    """Stage -> the stages its modules import, anywhere in the module (top level, functions, TYPE_CHECKING)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # ``from yolofeed.monitor import steps`` imports a module; ``from yolofeed.x import Name`` x itself
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            for target in targets:
                a, b = _stage(name), _stage(target) if target.startswith("yolofeed") else None
                if a and b and a != b:
                    graph[a].add(b)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` as the list of its nodes (first one repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node))), None)


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_stage_imports_its_way_back_to_itself():
    graph = stage_graph()
    assert {"doctor", "bench", "measure", "monitor", "train"} <= set(graph)  # the graph sees the stages
    assert "measure" in graph["doctor"] and "measure" in graph["bench"]  # both run measure.profile
    assert "monitor" in graph["measure"]  # on monitor's clocks and sampler
    assert cycle(graph) is None, f"import cycle between stages: {' -> '.join(cycle(graph))}"
    assert "bench" not in graph["doctor"]


@pytest.mark.slow
def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    """A cycle hidden by lazy imports, or a module that only works after another was imported, fails here; and
    so does one that needs the optional tensorboard package to import."""
    names = [m for m in _modules() if m != "yolofeed.__main__"]  # __main__ runs the command line
    if importlib.util.find_spec("triton") is None:  # optional: the Triton kernels need it (CUDA builds of torch)
        names = [m for m in names if not m.endswith("_triton")]
    code = ("import importlib, sys\n"
            "sys.modules['tensorboard'] = None  # optional: every module imports without it\n"
            f"for name in {names!r}:\n"
            "    for loaded in [m for m in sys.modules if m.startswith('yolofeed')]:\n"
            "        del sys.modules[loaded]  # each module first, as if nothing of yolofeed were loaded\n"
            "    importlib.import_module(name)\n"
            f"print('imported', len({names!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"imported {len(names)}" in r.stdout


# -- the floors and the modules ------------------------------------------------------------------------------------
# The stages bottom up: a stage imports only stages on floors below its own (what the process may use, cores and
# memory, at the bottom: config sizes its worker counts on it). The kernels and the batch schema
# stand under the stages that share them (pack and augment share the kernels, loader and augment the schema).
FLOORS = [
    {"limits"},
    {"errors", "config", "processes", "kernels"},
    {"schema", "ultralytics_seam", "atomic"},
    {"pack", "augment", "monitor"},
    {"loader", "synth"},
    {"train", "measure"},
    {"doctor", "cli"},
    {"bench"},
]


def test_each_stage_imports_only_the_floors_below_it():
    floor = {stage: i for i, stages in enumerate(FLOORS) for stage in stages}
    graph = stage_graph()
    stages = set(graph) | set().union(*graph.values())
    assert stages <= set(floor), f"stages on no floor: {sorted(stages - set(floor))} (add them to FLOORS)"
    upward = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs if floor[b] >= floor[a])
    assert not upward, f"imports of a stage on the same floor or above: {upward}"
    assert not graph["kernels"] and graph["schema"] <= {"errors"}  # torch and Triton only; the schema's one error


def _all_names(tree: ast.Module) -> set[str]:
    """The names a module lists in ``__all__``."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set()


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, anywhere in it (top level, functions, TYPE_CHECKING).

    A package's ``__init__`` that hands a name on is a door, not a room: a name taken from it counts as taken from
    the module that defines it, and its imports of the names it lists in ``__all__`` are no edges of its own.
    """
    modules = _modules()
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}

    def origin(module: str, name: str, seen: frozenset = frozenset()) -> str:
        if f"{module}.{name}" in modules:
            return f"{module}.{name}"
        if modules[module].name == "__init__.py" and module not in seen:
            for node in ast.walk(trees[module]):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                    for a in node.names:
                        if (a.asname or a.name) == name:
                            return origin(node.module, a.name, seen | {module})
        return module

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, tree in trees.items():
        door = modules[name].name == "__init__.py"
        handed_on = _all_names(tree) if door else set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name in modules]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                if door and all((a.asname or a.name) in handed_on for a in node.names):
                    continue
                targets = [origin(node.module, a.name) for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t != name)
    return graph


def test_the_module_graph_sees_through_package_doors():
    graph = module_graph()
    assert "yolofeed.schema" in graph["yolofeed.loader.prefetch"]  # a plain import
    assert "yolofeed.pack.store" in graph["yolofeed.loader.prefetch"]  # ``from yolofeed.pack import Pack``
    assert "yolofeed.kernels.warp_triton" in graph["yolofeed.augment.warp"]  # inside a function
    assert not graph["yolofeed.augment"]  # a door: it only hands names on


def test_no_module_imports_its_way_back_to_itself():
    """Between the files of a stage too: a circle of modules is one module in several files."""
    graph = module_graph()
    assert cycle(graph) is None, f"import cycle between modules: {' -> '.join(cycle(graph))}"
