"""``sluice data add`` checks a file against the run before it queues it: a file the run cannot take is
refused with a message and exit status 2, and nothing lands in the run's inbox."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sluice.cli import main
from sluice.control.inbox import inbox_of, load_arrays, save_arrays
from sluice.runs import RunDir
from sluice.runtimes.jobs import load_job

CLIENTS = 3
FEATURES = 64  # digits: 8x8 pixels
CLASSES = 10


def _run_dir(path: Path, kind: str, overrides: list[str]) -> Path:
    """A run directory as ``run_job`` leaves it before training: the resolved job in ``config.toml``."""
    with RunDir(path) as run:
        run.write_config(load_job(kind, None, overrides).dump())
    return path


@pytest.fixture()
def hfl_run(tmp_path: Path) -> Path:
    return _run_dir(tmp_path / "hfl", "hfl", [f"data.num_clients={CLIENTS}", "model.hidden=[8]"])


def _good(n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, n)


def _queued(run: Path) -> list[Path]:
    box = inbox_of(run)
    return sorted(box.glob("*")) if box.exists() else []


def _said(capsys: pytest.CaptureFixture[str]) -> SimpleNamespace:
    """What the command printed (``out``, ``err``), with the console's line wrapping undone."""
    got = capsys.readouterr()
    return SimpleNamespace(out=" ".join(got.out.split()), err=" ".join(got.err.split()))


def test_config_names_the_engine(hfl_run: Path) -> None:
    assert 'engine = "hfl"' in (hfl_run / "config.toml").read_text()


def test_good_file_is_queued(hfl_run: Path, tmp_path: Path, capsys) -> None:
    X, y = _good()
    f = save_arrays(tmp_path / "good.npz", X, y)
    assert main(["data", "add", str(hfl_run), str(f), "--client", "2"]) == 0
    (queued,) = _queued(hfl_run)
    got = load_arrays(queued)
    assert got["client"] == 2 and np.array_equal(got["X"], X) and np.array_equal(got["y"], y)
    assert "queued 5 samples" in _said(capsys).out


def test_client_from_the_file(hfl_run: Path, tmp_path: Path) -> None:
    X, y = _good()
    f = save_arrays(tmp_path / "good.npz", X, y, client=1)
    assert main(["data", "add", str(hfl_run), str(f)]) == 0
    (queued,) = _queued(hfl_run)
    assert load_arrays(queued)["client"] == 1


def test_running_run_is_told_when_it_takes_data(hfl_run: Path, tmp_path: Path, capsys) -> None:
    (hfl_run / "status.json").write_text(json.dumps({"status": "RUNNING"}))
    f = save_arrays(tmp_path / "good.npz", *_good())
    assert main(["data", "add", str(hfl_run), str(f)]) == 0
    assert "until the run next runs short of data" in _said(capsys).out
    assert len(_queued(hfl_run)) == 1


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, list[str], str]]:
    """name -> (file, extra CLI args, a word the refusal must contain)."""
    X, y = _good()
    out: dict[str, tuple[Path, list[str], str]] = {}

    def add(name: str, args: list[str], word: str, **arrays: np.ndarray) -> None:
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        out[name] = (path, args, word)

    add("features", [], "features", X=X[:, :10], y=y)
    add("nan_x", [], "finite", X=np.where(np.eye(5, FEATURES) > 0, np.nan, X), y=y)
    add("nan_y", [], "finite", X=X, y=np.array([0, 1, np.nan, 2, 3]))
    add("label_range", [], "labels", X=X, y=np.array([0, 1, 2, 3, CLASSES]))
    add("negative_label", [], "labels", X=X, y=np.array([0, 1, -1, 3, 4]))
    add("fractional_label", [], "labels", X=X, y=np.array([0, 1, 2.5, 3, 4]))
    add("missing_y", [], "X and y", X=X)
    add("pickle", [], "readable", X=X, y=np.array([{"a": 1}] * 5, dtype=object))
    add("client_range", ["--client", str(CLIENTS)], "client", X=X, y=y)
    add("file_client_range", [], "client", X=X, y=y, client=np.asarray(CLIENTS + 4))
    add("old_key", [], "allowed", X=X, y=y, terminal=np.asarray(0))
    add("rows", [], "rows", X=X, y=y[:3])
    return out


@pytest.mark.parametrize(
    "name",
    ["features", "nan_x", "nan_y", "label_range", "negative_label", "fractional_label", "missing_y", "pickle",
     "client_range", "file_client_range", "old_key", "rows"],
)
def test_bad_file_is_refused(name: str, hfl_run: Path, tmp_path: Path, capsys) -> None:
    path, args, word = _bad_files(tmp_path)[name]
    before = path.read_bytes()
    assert main(["data", "add", str(hfl_run), str(path), *args]) == 2
    err = _said(capsys).err
    assert "error:" in err and word in err and "Traceback" not in err
    assert _queued(hfl_run) == []
    assert path.read_bytes() == before  # the file is neither moved nor changed


def test_ended_run_takes_no_data(hfl_run: Path, tmp_path: Path, capsys) -> None:
    (hfl_run / "status.json").write_text(json.dumps({"status": "FINISHED"}))
    f = save_arrays(tmp_path / "good.npz", *_good())
    assert main(["data", "add", str(hfl_run), str(f)]) == 2
    assert "has ended (FINISHED)" in _said(capsys).err
    assert _queued(hfl_run) == []


def test_run_without_engine_kind_is_refused(tmp_path: Path, capsys) -> None:
    run = tmp_path / "old"
    run.mkdir()
    (run / "config.toml").write_text("seed = 0\n")
    f = save_arrays(tmp_path / "good.npz", *_good())
    assert main(["data", "add", str(run), str(f)]) == 2
    assert "names no engine kind" in _said(capsys).err
    assert _queued(run) == []


def test_not_a_run_directory(tmp_path: Path, capsys) -> None:
    f = save_arrays(tmp_path / "good.npz", *_good())
    assert main(["data", "add", str(tmp_path), str(f)]) == 2
    assert "no config.toml" in _said(capsys).err
    assert _queued(tmp_path) == []


def test_local_run_checks_data_and_has_no_clients(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path / "local", "local", ["model.hidden=[8]"])
    X, y = _good()
    assert main(["data", "add", str(run), str(save_arrays(tmp_path / "c.npz", X, y)), "--client", "0"]) == 2
    assert "federated" in _said(capsys).err
    assert main(["data", "add", str(run), str(save_arrays(tmp_path / "f.npz", X[:, :7], y))]) == 2
    assert "features" in _said(capsys).err
    assert _queued(run) == []
    assert main(["data", "add", str(run), str(save_arrays(tmp_path / "g.npz", X, y))]) == 0
    assert len(_queued(run)) == 1


def test_engine_kind_must_match_the_command(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('engine = "local"\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "r")]) == 2
    assert "engine = 'local'" in _said(capsys).err
    assert not (tmp_path / "r").exists()
