"""The layer rules of DESIGN.md: imports point downward only, also imports by string; no import cycle
between modules or between packages; one package lays out bytes (wire/); no private name imported from
another package.

The layers, top to bottom (a module may import its own layer and those below it, never one above)::

    entry points          sluice (the public API's lazy exports), sluice.__main__, cli/, service/, dashboard/
                          (the browser pages of the service and of run directories)
    runtimes and jobs     runtimes/ (jobs.py: the one place a job is assembled; training.py: one job trained into
                          a run directory; remote.py: one steered over a connection; api.py: run_task; plots.py;
                          flower/: Flower's deployment and simulation engines), roles/ (the producer and
                          consumer roles in memory, and the 3GPP rendering)
    control               control/, runs.py (run directories: config, metrics lines, summaries),
                          tensorboard.py (metrics lines as TensorBoard events)
    engines               hfl/, split/, local/, engine.py (the protocol control drives every engine through)
    bytes, codecs, links  wire/ (the one byte format, state and checkpoints included), compress/, transport/,
                          psi/ (private set intersection over any channel)
    tasks, data, models   tasks/, data/, models/
    foundation            errors.py, schema.py, config.py, metrics.py, files.py (atomic writes), _lazy.py

A package is a subpackage of sluice or one of its top-level modules. An import is an ``import`` or ``from``
statement anywhere (top level, in a function, under TYPE_CHECKING), an ``importlib.import_module`` (or
``__import__``) call whose argument is a string or starts with one, a ``"sluice.x.y:name"`` string that a
loader resolves, or a ``lazy_exports`` table. A private name (leading underscore, not a dunder) is private to
the package that holds it; ``sluice._lazy`` belongs to the whole distribution.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "sluice"

LAYERS: dict[str, tuple[str, ...]] = {
    "entry points": ("sluice", "sluice.__main__", "sluice.cli", "sluice.service", "sluice.dashboard"),
    "runtimes and jobs": ("sluice.runtimes", "sluice.roles"),
    "control": ("sluice.control", "sluice.runs", "sluice.tensorboard"),
    "engines": ("sluice.hfl", "sluice.split", "sluice.local", "sluice.engine"),
    "bytes, codecs and links": ("sluice.wire", "sluice.compress", "sluice.transport", "sluice.psi"),
    "tasks, data and models": ("sluice.tasks", "sluice.data", "sluice.models"),
    "foundation": ("sluice.errors", "sluice.schema", "sluice.config", "sluice.metrics", "sluice.files",
                   "sluice._lazy"),
}
"""Each layer's packages, top layer first."""

RANK = {unit: len(LAYERS) - i for i, units in enumerate(LAYERS.values()) for unit in units}
LAYER_OF = {unit: name for name, units in LAYERS.items() for unit in units}
FRAME_TOOLS = ("frame", "unframe", "check_header", "varint", "read_varint")
"""What :mod:`sluice.wire.frame` lays bytes out with; nothing outside wire/ imports them."""
LOADER_REF = re.compile(r"^sluice(\.\w+)*:\w+(\.\w+)*$")
"""A string a loader resolves to ``module:attribute``, e.g. ``"sluice.hfl:engine_from_config"``."""


def _unit(module: str) -> str:
    """The package ``module`` belongs to: ``sluice.hfl`` for ``sluice.hfl.server``, ``sluice.runs`` for itself."""
    return module if module == "sluice" else ".".join(module.split(".")[:2])


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_parts(dotted: str) -> set[tuple[str, str]]:
    """``(holder, name)`` for each private part of a dotted sluice name: ``sluice.wire.vector._rice_encode``
    gives ``("sluice.wire.vector", "_rice_encode")``."""
    parts = dotted.split(".")
    return {(".".join(parts[:i]), p) for i, p in enumerate(parts) if i and _is_private(p)}


def _known(ref: str, known: set[str]) -> str | None:
    """The longest module of ``known`` that the dotted name ``ref`` names or lies inside."""
    parts = ref.strip(".").split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in known:
            return ".".join(parts[:i])
    return None


@dataclass
class Scan:
    """What one module uses of sluice: the modules it imports and the private names it reaches for."""

    imports: set[str] = field(default_factory=set)
    private: set[tuple[str, str]] = field(default_factory=set)


def _from_target(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".")
    drop = node.level - 1 if is_package else node.level
    base = base[: len(base) - drop] if drop else base
    return ".".join(base + ([node.module] if node.module else []))


def _string_prefix(node: ast.expr) -> str | None:
    """A string argument, or the literal start of an f-string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _by_string(name: str, tree: ast.Module, known: set[str], scan: Scan) -> None:
    """Imports by string: ``import_module``/``__import__`` calls, loader references, ``lazy_exports`` tables."""
    tables = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
              for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and LOADER_REF.match(node.value):
            module, attr = node.value.split(":")
            if (hit := _known(module, known)) is not None:
                scan.imports.add(hit)
                scan.private |= _private_parts(f"{module}.{attr}")
        elif isinstance(node, ast.Call) and _call_name(node) in ("import_module", "__import__") and node.args:
            ref = _string_prefix(node.args[0])
            if ref and (hit := _known(ref, known)) is not None:
                scan.imports.add(hit)
                scan.private |= _private_parts(ref.strip("."))
        elif isinstance(node, ast.Call) and _call_name(node) == "lazy_exports" and len(node.args) == 2:
            table = node.args[1]
            table = tables.get(table.id, table) if isinstance(table, ast.Name) else table
            for value in getattr(table, "values", []):
                if isinstance(value, ast.Constant) and (hit := _known(f"{name}.{value.value}", known)):
                    scan.imports.add(hit)


def _scan(name: str, path: Path, known: set[str]) -> Scan:
    """Sluice modules ``name`` imports anywhere in its source (top level, in functions, under TYPE_CHECKING,
    by string): ``from a import b`` counts as importing ``a.b`` when that is a module, else ``a``; and the
    private names it imports or reads off an imported sluice module."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    scan = Scan()
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    scan.imports.add(a.name)
                    if a.asname:
                        bound[a.asname] = a.name
                if a.name.startswith("sluice."):
                    scan.private |= _private_parts(a.name)
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(name, is_package, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    scan.imports.add(sub)
                    bound[alias.asname or alias.name] = sub
                elif target in known:
                    scan.imports.add(target)
                if target.startswith("sluice"):
                    scan.private |= _private_parts(sub)
    _by_string(name, tree, known, scan)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and _is_private(node.attr)):
            scan.private.add((bound[node.value.id], node.attr))
    scan.imports.discard(name)
    return scan


def _byte_tools(path: Path) -> set[str]:
    """What ``path`` imports of the tools that lay out bytes: ``struct``, and frames and varints
    (:mod:`sluice.wire.frame`, also as re-exported by :mod:`sluice.wire`)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in ("struct", "sluice.wire.frame")}
        elif isinstance(node, ast.ImportFrom) and node.module in ("struct", "sluice.wire.frame"):
            out.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module == "sluice.wire":
            out |= {f"sluice.wire.{a.name}" for a in node.names if a.name in FRAME_TOOLS}
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    return _scan(name, path, known).imports


def _scans() -> dict[str, Scan]:
    mods = _modules()
    known = set(mods)
    return {name: _scan(name, path, known) for name, path in mods.items()}


def _graph() -> dict[str, set[str]]:
    return {name: scan.imports for name, scan in _scans().items()}


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out.setdefault(_unit(mod), set()).update(_unit(d) for d in deps if _unit(d) != _unit(mod))
    return out


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer, as ``module (layer) imports module (layer)``."""
    return sorted(
        f"{mod} ({LAYER_OF[_unit(mod)]}) imports {dep} ({LAYER_OF[_unit(dep)]})"
        for mod, deps in graph.items()
        for dep in deps
        if RANK[_unit(dep)] > RANK[_unit(mod)]
    )


def _crossings(scans: dict[str, Scan]) -> list[str]:
    """Every private name a module takes from another package."""
    return sorted(
        f"{mod} uses {holder}.{priv}"
        for mod, scan in scans.items()
        for holder, priv in scan.private
        if holder != "sluice" and _unit(holder) != _unit(mod)
    )


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


def test_the_checker_finds_cycles_imports_and_private_names(tmp_path: Path) -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(g) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    src = tmp_path / "client.py"
    src.write_text(
        "from __future__ import annotations\n"
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "import sluice.hfl\n"
        "from . import engine\n"
        "from ..control import params\n"
        "from sluice.wire.vector import _rice_encode\n"
        "if TYPE_CHECKING:\n"
        "    from sluice.control import Termination\n"
        "def f():\n"
        "    from sluice.wire.frame import X\n"
        "    importlib.import_module('sluice.cli.run')\n"
        "    importlib.import_module(f'sluice.data.scenarios.{X}')\n"
        "    return 'sluice.service.chain:ChainConfig', params._hidden\n",
        encoding="utf-8",
    )
    known = {"sluice.control", "sluice.control.params", "sluice.hfl", "sluice.hfl.engine", "sluice.hfl.client",
             "sluice.wire", "sluice.wire.frame", "sluice.wire.vector", "sluice.cli", "sluice.cli.run",
             "sluice.data", "sluice.data.scenarios", "sluice.service", "sluice.service.chain"}
    scan = _scan("sluice.hfl.client", src, known)
    assert scan.imports == {
        "sluice.hfl", "sluice.hfl.engine", "sluice.control.params", "sluice.control", "sluice.wire.frame",
        "sluice.wire.vector", "sluice.cli.run", "sluice.data.scenarios", "sluice.service.chain",
    }
    assert scan.private == {("sluice.wire.vector", "_rice_encode"), ("sluice.control.params", "_hidden")}
    assert _crossings({"sluice.hfl.client": scan}) == ["sluice.hfl.client uses sluice.control.params._hidden",
                                                       "sluice.hfl.client uses sluice.wire.vector._rice_encode"]
    assert _crossings({"sluice.wire.frame": Scan(private={("sluice.wire.vector", "_x"), ("sluice", "_lazy")})}) == []
    init = tmp_path / "__init__.py"
    init.write_text("from sluice._lazy import lazy_exports\n_LAZY = {'Engine': 'engine'}\n"
                    "__getattr__ = lazy_exports(__name__, _LAZY)\n", encoding="utf-8")
    assert _imports("sluice.hfl", init, known | {"sluice._lazy"}) == {"sluice._lazy", "sluice.hfl.engine"}
    assert _upward({"sluice.hfl.client": {"sluice.cli.run", "sluice.wire.frame"}}) == [
        "sluice.hfl.client (engines) imports sluice.cli.run (entry points)"]


def test_every_package_has_a_layer() -> None:
    units = {_unit(m) for m in _modules()}
    assert not units - set(RANK), f"packages in no layer: {sorted(units - set(RANK))}"
    assert not set(RANK) - units, f"layers name packages that do not exist: {sorted(set(RANK) - units)}"


def test_no_import_cycle() -> None:
    graph = _graph()
    assert len(graph) > 50 and "sluice.control.process" in graph["sluice.roles.producer"]
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" → ".join(c) for c in cycles)


def test_no_import_cycle_between_packages() -> None:
    cycles = _cycles(_package_graph(_graph()))
    assert not cycles, "package cycles: " + "; ".join(" → ".join(c) for c in cycles)


def test_imports_point_downward() -> None:
    bad = _upward(_graph())
    assert not bad, "upward imports: " + "; ".join(bad)


def test_one_package_lays_out_bytes(tmp_path: Path) -> None:
    """Every byte format (messages, state and checkpoints) lives in wire/: no module elsewhere packs binary
    fields with ``struct`` or builds frames and varints itself."""
    probe = tmp_path / "probe.py"
    probe.write_text("import struct\nfrom sluice.wire import varint, Payload\nfrom sluice.wire.frame import frame\n",
                     encoding="utf-8")
    assert _byte_tools(probe) == {"struct", "sluice.wire.varint", "sluice.wire.frame"}
    bad = sorted(f"{mod} imports {', '.join(sorted(tools))}" for mod, path in _modules().items()
                 if _unit(mod) != "sluice.wire" and (tools := _byte_tools(path)))
    assert not bad, "byte formats outside wire/: " + "; ".join(bad)


def test_no_private_name_crosses_a_package() -> None:
    bad = _crossings(_scans())
    assert not bad, "private names used across packages: " + "; ".join(bad)


@pytest.mark.parametrize("package", ["sluice.hfl", "sluice.split", "sluice.local"])
def test_importing_an_engine_loads_no_control_module(package: str) -> None:
    code = (f"import sys, {package}\n"
            "print(','.join(sorted(m for m in sys.modules if m == 'sluice.control' "
            "or m.startswith('sluice.control.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"importing {package} loaded {out.stdout.strip()}"
