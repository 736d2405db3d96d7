"""``sluice --help``, ``--version`` and every sub-command's ``--help`` build the parser from light modules:
no engine, torch, scikit-learn, SciPy, matplotlib or gRPC is imported to answer them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HEAVY = ("torch", "sklearn", "scipy", "matplotlib", "grpc")

_PROBE = """
import contextlib, io, json, sys
from sluice.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _probe(argv: list[str]) -> dict:
    """Run ``sluice ARGV`` in a fresh interpreter: its exit code, stdout and the heavy packages it loaded."""
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    got["heavy"] = [m for m in HEAVY if m in got["modules"]]
    return got


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--help"], "usage: sluice"),
        (["run", "--help"], "usage: sluice run"),
        (["local", "--help"], "usage: sluice local"),
        (["split", "run", "--help"], "usage: sluice split run"),
        (["split", "party", "--help"], "usage: sluice split party"),
        (["data", "add", "--help"], "usage: sluice data add"),
        (["report", "--help"], "usage: sluice report"),
    ],
)
def test_help_imports_nothing_heavy(argv: list[str], expected: str) -> None:
    got = _probe(argv)
    assert got["code"] == 0 and expected in got["out"]
    assert got["heavy"] == []


def test_version_imports_nothing_heavy() -> None:
    from sluice import __version__

    got = _probe(["--version"])
    assert got["code"] == 0 and got["out"].strip() == f"sluice {__version__}"
    assert got["heavy"] == []


def test_the_probe_sees_heavy_imports(tmp_path: Path) -> None:
    """The checks above can fail: a command that builds an engine (``data add`` checks a file against a
    run's engine) does import torch, and the probe reports it."""
    from sluice.runs import RunDir
    from sluice.runtimes.jobs import load_job

    with RunDir(tmp_path / "run") as run:
        run.write_config(load_job("hfl", None, ["data.num_clients=2", "model.hidden=[4]"]).dump())
    bad = tmp_path / "bad.npz"
    np.savez(bad, X=np.zeros((2, 3)), y=np.zeros(2, dtype=np.int64))
    got = _probe(["data", "add", str(tmp_path / "run"), str(bad)])
    assert got["code"] == 2 and "torch" in got["heavy"]


@pytest.mark.parametrize("kind", ["hfl", "local", "split"])
def test_reading_a_job_imports_no_engine(kind: str) -> None:
    """Validating a job (what a service does on every request) builds no engine and loads no torch."""
    code = (f"import json, sys\nfrom sluice.runtimes.jobs import load_job\njob = load_job({kind!r})\n"
            "print(json.dumps([m for m in sys.modules if m.split('.')[0] in " + repr(list(HEAVY)) + "]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
