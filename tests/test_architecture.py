"""The import contract, read from the source with ``ast`` (no new dependency):

* ``inference/`` never imports ``chatui`` or ``textual`` (anywhere in a file, even inside a
  function: the engine must run without the UI installed);
* no import cycle among the modules of ``chatui/``, ``inference/`` and ``themes/``, counting the
  imports that run when a module is imported (module level, class bodies, ``try``/``if``
  blocks; not inside functions, not under ``if TYPE_CHECKING:``).

A cycle means two modules cannot be understood, tested or changed apart, and which one finishes
importing first depends on who imports first. The checker is tested on small made-up packages
below, so a broken checker cannot pass silently.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chatui", "inference", "themes")


@dataclass(frozen=True)
class Import:
    """One import statement of a module, resolved to absolute module names."""

    targets: tuple[str, ...]
    at_import_time: bool
    """False inside a function body or under ``if TYPE_CHECKING:``."""
    type_checking: bool
    """Under ``if TYPE_CHECKING:`` (never runs)."""
    line: int


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the packages."""
    found: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(nodes: list[ast.stmt], in_function: bool = False,
          type_checking: bool = False) -> Iterator[tuple[ast.stmt, bool, bool]]:
    """Every statement, with whether it is inside a function and under ``if TYPE_CHECKING:``."""
    for node in nodes:
        yield node, in_function, type_checking
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _walk(node.body, True, type_checking)
        elif isinstance(node, ast.If):
            yield from _walk(node.body, in_function,
                             type_checking or _is_type_checking(node.test))
            yield from _walk(node.orelse, in_function, type_checking)
        else:
            for field in ("body", "orelse", "finalbody"):
                yield from _walk(getattr(node, field, []) or [], in_function, type_checking)
            for handler in getattr(node, "handlers", []) or []:
                yield from _walk(handler.body, in_function, type_checking)
            for case in getattr(node, "cases", []) or []:
                yield from _walk(case.body, in_function, type_checking)


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    """The imports in one module's source, resolved against ``known`` module names."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node, in_function, type_checking in _walk(tree.body):
        if isinstance(node, ast.Import):
            targets = tuple(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import mod`` imports the submodule; ``from mod import name`` the module
            targets = tuple(f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                            for a in node.names)
        else:
            continue
        found.append(Import(tuple(dict.fromkeys(targets)),
                            not (in_function or type_checking), type_checking, node.lineno))
    return found


def _internal(target: str, known: set[str]) -> str | None:
    """The known module a dotted import names (``a.b.c`` of a known ``a.b`` is ``a.b``)."""
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def import_graph(root: Path, packages: tuple[str, ...], *,
                 deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the internal modules it imports at import time (with ``deferred``, also the
    imports inside functions; never those under ``if TYPE_CHECKING:``)."""
    files = module_files(root, packages)
    known = set(files)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for imp in imports_of(module, path, known):
            if not (imp.at_import_time or deferred and not imp.type_checking):
                continue
            for target in imp.targets:
                inner = _internal(target, known)
                if inner is not None and inner != module:
                    graph[module].add(inner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) for every group of modules that import each other
    (Tarjan's strongly connected components, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return [_one_cycle(graph, set(g)) for g in sorted(groups)]


def _one_cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the first module of a strongly connected group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group has one


# ---- the contract on this repository ----


def _imports_in(package: str) -> Iterator[tuple[str, str, str]]:
    """(module, where: "path:line", target) for every import of every module of ``package``,
    inside functions too."""
    files = module_files(ROOT, PACKAGES)
    known = set(files)
    for module, path in files.items():
        if module.split(".")[0] == package:
            for imp in imports_of(module, path, known):
                for target in imp.targets:
                    yield module, f"{path.relative_to(ROOT)}:{imp.line}", target


def test_inference_never_imports_the_ui():
    bad = [f"{where} imports {target}" for _module, where, target in _imports_in("inference")
           if target.split(".")[0] in ("chatui", "textual")]
    assert not bad, "inference/ must not import chatui or textual:\n" + "\n".join(bad)


UI_REACHES_THE_ENGINE_THROUGH = ("inference.types", "inference.settings", "inference.worker",
                                  "inference.backend")
"""What any module of ``chatui/`` may import from ``inference/``: the plain data types, the
frozen sampling settings, the worker's async API and the ``Backend`` protocol (README, "How the
engine works")."""

BUILDERS = {
    "chatui.backends": ("inference.checkpoint", "inference.engine", "inference.scripted",
                        "inference.openai_backend"),
    "chatui.cli.headless": ("inference.checkpoint",),
    "chatui.cli.commands": ("inference.bench", "inference.kernel_build"),
}
"""...and the few modules that may import more: the one that builds what the worker runs (the
backend factories) and the headless commands of the engine's own (``chatui bench``,
``chatui build-kernels``, a checkpoint checked before loading)."""


def _within(target: str, allowed: tuple[str, ...]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def test_the_ui_reaches_the_engine_only_through_its_api():
    bad = [f"{where} imports {target}" for module, where, target in _imports_in("chatui")
           if target.split(".")[0] == "inference" and target != "inference"
           and not _within(target, UI_REACHES_THE_ENGINE_THROUGH + BUILDERS.get(module, ()))]
    assert not bad, ("chatui/ reaches inference/ through its worker, types, settings and "
                     "Backend protocol (and the builders listed in BUILDERS):\n" + "\n".join(bad))


def test_no_import_cycles():
    found = cycles(import_graph(ROOT, PACKAGES))
    report = "\n".join(" -> ".join(c) for c in found)
    print(f"{len(found)} import cycle(s):\n{report}")
    assert not found, f"modules that import each other back:\n{report}"


def test_no_import_cycles_even_through_imports_inside_functions():
    found = cycles(import_graph(ROOT, PACKAGES, deferred=True))
    report = "\n".join(" -> ".join(c) for c in found)
    print(f"{len(found)} import cycle(s) counting imports inside functions:\n{report}")
    assert not found, f"modules that import each other back (inside functions):\n{report}"


# ---- the checker itself, on made-up packages ----


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_a_cycle_through_relative_and_package_imports(tmp_path: Path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "from .sub.c import thing\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "import pkg.a\nthing = 1\n",
        "pkg/d.py": "from pkg import a\n",  # imports into the cycle, is not part of it
    })
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]


def test_checker_ignores_imports_inside_functions_and_type_checking(tmp_path: Path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": ("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from pkg import a\n"
                     "def f():\n    from pkg import a\n"),
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "pkg/d.py": "def f():\n    from pkg import c\n",
    })
    assert cycles(import_graph(tmp_path, ("pkg",))) == []
    assert cycles(import_graph(tmp_path, ("pkg",), deferred=True)) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_checker_counts_imports_in_try_and_else_blocks(tmp_path: Path):
    _write(tmp_path, {
        "pkg/__init__.py": "from .a import x\n",
        "pkg/a.py": "try:\n    from .b import y\nexcept ImportError:\n    y = None\nx = 1\n",
        "pkg/b.py": ("import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n"
                     "    from pkg import x\ny = 2\n"),
    })
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg", "pkg.a", "pkg.b", "pkg"]]
