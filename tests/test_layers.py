"""The layer rules of DESIGN.md: no import cycle anywhere in sluice, and engines and everything below them
never import the control plane, jobs or the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "sluice"

LOWER = ("hfl", "vfl", "local", "wire", "compress", "transport", "data", "models")
"""Packages below the control plane (engines and what they stand on)."""
UPPER = ("sluice.control", "sluice.jobs", "sluice.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Sluice modules ``name`` imports anywhere in its source (top level, in functions, under
    TYPE_CHECKING): ``from a import b`` counts as importing ``a.b`` when that is a module, else ``a``."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, set(c)) for c in comps]


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A concrete cycle a → b → ... → a inside a strongly connected component."""
    start = min(comp)
    path, seen = [start], {start}
    while True:
        nxt = min(w for w in graph[path[-1]] if w in comp)
        if nxt in seen:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)
        seen.add(nxt)


def test_the_checker_finds_cycles_and_imports(tmp_path: Path) -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(g) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    src = tmp_path / "client.py"
    src.write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import sluice.hfl\n"
        "from . import engine\n"
        "from ..control import params\n"
        "if TYPE_CHECKING:\n"
        "    from sluice.control import Termination\n"
        "def f():\n"
        "    from sluice.wire.frame import X\n",
        encoding="utf-8",
    )
    known = {"sluice.control", "sluice.control.params", "sluice.hfl", "sluice.hfl.engine", "sluice.hfl.client",
             "sluice.wire", "sluice.wire.frame"}
    assert _imports("sluice.hfl.client", src, known) == {
        "sluice.hfl", "sluice.hfl.engine", "sluice.control.params", "sluice.control", "sluice.wire.frame"
    }


def test_no_import_cycle() -> None:
    graph = _graph()
    assert len(graph) > 50 and "sluice.control.process" in graph["sluice.control.producer"]
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" → ".join(c) for c in cycles)


def test_lower_layers_never_import_control_jobs_or_cli() -> None:
    graph = _graph()
    bad = sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if mod.split(".")[1:2] and mod.split(".")[1] in LOWER
        for dep in deps
        if any(dep == u or dep.startswith(u + ".") for u in UPPER)
    )
    assert not bad, "layer violations: " + "; ".join(bad)


@pytest.mark.parametrize("package", ["sluice.hfl", "sluice.vfl", "sluice.local"])
def test_importing_an_engine_loads_no_control_module(package: str) -> None:
    code = (f"import sys, {package}\n"
            "print(','.join(sorted(m for m in sys.modules if m == 'sluice.control' "
            "or m.startswith('sluice.control.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"importing {package} loaded {out.stdout.strip()}"
