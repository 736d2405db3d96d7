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


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_blocks_not_run_here_name_a_test_that_exists(page: Path) -> None:
    for _, _, _, cover in blocks(page):
        if cover is None:
            continue
        path, name = cover.split("::")
        assert re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), cover


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs_as_written(page: Path, tmp_path: Path) -> None:
    for name in (".venv", "examples", "src"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    res = subprocess.run(["bash", "-c", script(page)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=840)
    assert res.returncode == 0, f"{page.name}:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"


def test_install_block_is_the_readmes_setup() -> None:
    """The tutorial's install command is the README's first command (which CI runs on a fresh clone)."""
    install = next(code for _, code, _, cover in blocks(ROOT / "docs" / "tutorials" / "first-run.md") if cover)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = FENCE.search(readme).group(3)
    assert install.strip() in first, (install, first)
