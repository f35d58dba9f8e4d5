"""Ultralytics' installed source read as code: the attributes a class assigns, a function's normalised source and its
hash, and the object a qualified name names. The seam's checks at import and tests/test_seam.py's drift test use it."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import textwrap
from typing import Any


def assigned_attributes(cls: type) -> set[str]:
    """The names ``self.<name> = ...`` assigns (tuple targets included) in the methods of ``cls`` and of its bases
    from the same package (Ultralytics' for a trainer), as their installed source reads.

    Raises:
        OSError: the source is not available (an installation without .py files).
    """
    package = cls.__module__.split(".")[0]
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] != package:
            continue
        for node in ast.walk(_class_source(klass)):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
    return names


def _class_source(klass: type) -> ast.AST:
    """The parsed source of a class: found in its module's parsed file (a module-level class; each file parsed once),
    else through ``inspect.getsource``, which parses the whole file again for each class."""
    path = inspect.getsourcefile(klass)
    if path:
        found = (n for n in _parsed_file(path).body if isinstance(n, ast.ClassDef) and n.name == klass.__qualname__)
        node = next(found, None)
        if node is not None:
            return node
    return ast.parse(textwrap.dedent(inspect.getsource(klass)))


@functools.cache  # emptied by clear_cache after the check at import
def _parsed_file(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


def clear_cache() -> None:
    """Forget the parsed files (a check at import reads each once, then they are not needed)."""
    _parsed_file.cache_clear()


def resolve(qualname: str) -> Any:
    """The object a qualified name (``package.module.Class.method``) names: the longest importable module, then
    attributes."""
    parts = qualname.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for name in parts[k:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"nothing importable in {qualname}")


def normalised_source(fn: Any) -> str:
    """``fn``'s code as ``ast.unparse`` prints it, docstring left out: comments and formatting are not drift.

    Raises:
        OSError: the source is not available (an installation without .py files).
    """
    fn = threaded_function(fn)
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    if ast.get_docstring(node, clean=False) is not None:
        node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(node) + "\n"


def threaded_function(fn: Any) -> Any:
    """The function an Ultralytics ``@threaded`` wrapper runs (it keeps no ``__wrapped__``: the closure's ``func``),
    else ``fn``."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is not None and cells and code.co_freevars == ("func",) and code.co_name == "wrapper":
        return cells[0].cell_contents
    return fn


def source_hash(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of a normalised source."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
