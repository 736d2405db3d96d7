"""The documentation site builds with ``mkdocs build --strict`` (a broken link, anchor or API reference fails),
and the reference pages generated from the code are up to date (``python scripts/gen_reference.py``)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "python scripts/gen_reference.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(360)
def test_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"mkdocs build --strict failed:\n{res.stdout[-6000:]}\n{res.stderr[-6000:]}"
    for page in ("index.html", "reference/cli/index.html", "reference/config/index.html",
                 "reference/python-api/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    assert "sluice.Task" in api and "run_task" in api and ":class:" not in api
    assert 'href="../../stylesheets/tables.css"' in api  # wide tables wrap instead of being cut off


def test_generated_reference_is_up_to_date() -> None:
    gen = _generator()
    stale = [str(p.relative_to(ROOT)) for p, text in gen.outputs().items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    assert not stale, f"generated reference pages are stale: {', '.join(stale)}; run `{REGENERATE}` and commit them"


def test_generated_reference_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults some options read from the environment, and the terminal width, do not leak into the pages."""
    gen = _generator()
    before = gen.render_cli()
    monkeypatch.setenv("SLUICE_PRODUCER", "https://elsewhere.example/ProvMnS/v1920/SubNetwork=X/MLTrainingFunction=Y")
    monkeypatch.setenv("SLUICE_TOKEN", "sluice_secret")
    monkeypatch.setenv("COLUMNS", "37")
    after = gen.render_cli()
    assert after == before
    assert "elsewhere.example" not in after and "sluice_secret" not in after


def test_cli_reference_names_every_command() -> None:
    """Every sub-command, nested ones included, has its own heading in the command-line reference."""
    import argparse

    from sluice.cli import build_parser

    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")

    def walk(parser: argparse.ArgumentParser, prog: str) -> list[str]:
        out = [prog]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    out += walk(child, f"{prog} {name}")
        return out

    commands = walk(build_parser(), "sluice")
    assert {"sluice data add", "sluice split run", "sluice consumer fanout", "sluice token revoke"} <= set(commands)
    missing = [c for c in commands if f"# `{c}`\n" not in page]
    assert not missing, f"{missing} have no section in docs/reference/cli.md; run `{REGENERATE}`"


def test_config_reference_names_every_engine_key() -> None:
    """A key of every section of every engine kind, of the control sections and of the service appears."""
    page = (ROOT / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    for key in ("up_by_weight", "momentum_replay", "max_train_samples", "queue_threshold_bytes", "producer_timeout_s",
                "stop_when_met", "divergence_factor", "max_upload_bytes", "token_sha256", "pilot_pollution_cells"):
        assert f"| `{key}` |" in page, key


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    commands = re.findall(r"^```bash\n(.*?)^```", readme, re.S | re.M)
    assert commands[0].startswith("python3.11 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/sluice run")
    assert commands[1].strip() == ("python3.11 -m venv .venv && .venv/bin/pip install -e '.[test]' && "
                                   ".venv/bin/ruff check src tests bench && .venv/bin/pytest")
    assert commands[1].strip() in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target
