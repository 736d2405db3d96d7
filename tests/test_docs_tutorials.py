"""Every shell and Python block of the tutorials runs, as written, in the order of its page.

A page's blocks run in one bash script (``set -euo pipefail``) in a fresh directory that holds links to the
repository's ``.venv``, ``examples`` and ``src``: a ``bash`` block runs as it is, a ``python`` block through
the environment's interpreter, and a block whose fence names a file (``title="job.toml"``) is written to that
file instead. Background jobs a page starts are stopped when it ends. A block preceded by
``<!-- not run: covered by tests/FILE.py::TEST -->`` (setup that needs a fresh machine, several hosts) is not
run here, and the test it names must exist.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
COVERED = re.compile(r"<!-- not run: covered by (tests/[\w/]+\.py)::(\w+) -->\s*$")
TITLE = re.compile(r'title="([^"]+)"')


def blocks(page: Path) -> list[tuple[str, str, str | None, str | None]]:
    """``(language, code, file to write or None, covering test or None)`` of each fenced block."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip().splitlines()
        cover = COVERED.search(before[-1]) if before else None
        title = TITLE.search(m.group(2))
        out.append((m.group(1), m.group(3), title.group(1) if title else None,
                    f"{cover.group(1)}::{cover.group(2)}" if cover else None))
    return out


def script(page: Path) -> str:
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true; wait || true' EXIT"]
    for i, (lang, code, name, cover) in enumerate(blocks(page)):
        if cover is not None:
            continue
        if name is not None:
            lines.append(f"cat > {shlex.quote(name)} <<'SLUICE_BLOCK_{i}'\n{code}SLUICE_BLOCK_{i}")
        elif lang in ("bash", "sh", "console"):
            lines.append(code)
        elif lang == "python":
            lines.append(f".venv/bin/python - <<'SLUICE_BLOCK_{i}'\n{code}SLUICE_BLOCK_{i}")
    return "\n".join(lines) + "\n"


def test_there_are_tutorials() -> None:
    assert {p.stem for p in TUTORIALS} >= {"first-run", "own-model", "split-two-hosts", "service-consumer"}


COVERED_PAGES = [p for p in TUTORIALS if any(cover for *_, cover in blocks(p))]


def test_some_blocks_are_covered_elsewhere() -> None:
    assert {p.stem for p in COVERED_PAGES} >= {"first-run", "split-two-hosts"}


@pytest.mark.parametrize("page", COVERED_PAGES, ids=lambda p: p.stem)
def test_blocks_not_run_here_name_a_test_that_exists(page: Path) -> None:
    covers = [cover for *_, cover in blocks(page) if cover is not None]
    assert covers
    for cover in covers:
        path, name = cover.split("::")
        assert re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), cover


EXTRA = re.compile(r"\.\[([\w,]+)\]")
USER_EXTRAS = ("service", "flower", "docs")
"""The extras a page may tell its reader to install (``test`` is the suite's own)."""
BLOCKER = """import sys

BLOCKED = {blocked!r}


class _NotInstalled:
    \"\"\"Hides the packages of the extras the page does not install, as a venv made as it says lacks them.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (an extra this page does not install)", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def extra_modules() -> dict[str, set[str]]:
    """The top-level modules each user extra of ``pyproject.toml`` installs beyond the base dependencies."""
    import tomllib
    from importlib.metadata import packages_distributions

    def norm(req: str) -> str:
        return re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    by_dist: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(norm(dist), set()).add(module)
    base = {m for req in project["dependencies"] for m in by_dist.get(norm(req), ())}
    extras = project["optional-dependencies"]
    return {name: {m for req in extras[name] for m in by_dist.get(norm(req), ())} - base for name in USER_EXTRAS}


def installed_extras(page: Path) -> set[str]:
    """The extras the page's install lines name (``pip install -e '.[service]'``, in a block or in the text)."""
    return {e for m in EXTRA.finditer(page.read_text(encoding="utf-8")) for e in m.group(1).split(",")}


NEEDS = {"sluice serve": "service", "sluice consumer": "service", "--runtime flower": "flower",
         "mkdocs": "docs"}
"""Commands and the extra whose packages they import (the service's web stack and store, its HTTP client;
Flower; the documentation site): what the tutorials' runs check with the other extras hidden."""


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "how-to").glob("*.md")), ids=lambda p: p.stem)
def test_a_how_to_names_the_extras_its_commands_need(page: Path) -> None:
    code = "\n".join(c for lang, c, _, _ in blocks(page) if lang in ("bash", "sh", "console"))
    needed = {extra for command, extra in NEEDS.items() if command in code}
    assert needed <= installed_extras(page), f"{page.name} runs commands of extras {sorted(needed)} but its install " \
        f"line names {sorted(installed_extras(page))}"


def test_a_page_without_an_install_line_hides_every_extra() -> None:
    modules = extra_modules()
    assert {"fastapi", "sqlalchemy", "httpx"} <= modules["service"] and "flwr" in modules["flower"]
    assert not modules["service"] & {"torch", "numpy", "grpc"}
    assert installed_extras(ROOT / "docs" / "tutorials" / "service-consumer.md") == {"service"}
    assert installed_extras(ROOT / "docs" / "tutorials" / "first-run.md") == set()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs_as_written(page: Path, tmp_path: Path) -> None:
    """The page's blocks run with the packages of every extra it does not install hidden from Python."""
    for name in (".venv", "examples", "src"):
        (tmp_path / name).symlink_to(ROOT / name)
    modules = extra_modules()
    blocked = set().union(*(modules[e] for e in USER_EXTRAS if e not in installed_extras(page)))
    site = tmp_path.parent / f"{tmp_path.name}-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    res = subprocess.run(["bash", "-c", script(page)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=840)
    assert res.returncode == 0, f"{page.name}:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"


def test_install_block_is_the_readmes_setup() -> None:
    """The tutorial's install command is the README's first command (which CI runs on a fresh clone)."""
    install = next(code for _, code, _, cover in blocks(ROOT / "docs" / "tutorials" / "first-run.md") if cover)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = FENCE.search(readme).group(3)
    assert install.strip() in first, (install, first)
