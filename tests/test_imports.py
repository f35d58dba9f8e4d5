"""The stages depend on each other one way: every module imports on its own, and no chain of imports (lazy ones,
inside functions, included) leads from a stage back to itself, between doctor and bench in particular."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

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
