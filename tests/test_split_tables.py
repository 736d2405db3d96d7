"""Vertical parties with their own tables (examples/vertical): the run, and every kind of bad input refused
before training with one line that says what is wrong, nothing written."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vertical"


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tables")
    subprocess.run([sys.executable, str(EXAMPLE / "make_tables.py"), "--out", str(out)], check=True,
                   capture_output=True)
    return out


@pytest.fixture(autouse=True)
def _factory_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the leader (this process)
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))  # follower processes
    monkeypatch.setenv("COLUMNS", "4000")  # one line is one line, however long


def _rows(path: Path) -> list[list[str]]:
    with path.open() as f:
        return list(csv.reader(f))


def _write(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def _run(tmp_path: Path, tables: Path, *sets: str, kind: str = "inproc") -> tuple[int, Path]:
    out = tmp_path / "run"
    args = ["split", "run", "--out", str(out), "--set", 'task.factory="task:vertical"',
            "--set", f'task.args.tables="{tables}"', "--set", "train.epochs=1", "--set", f"transport.kind={kind}"]
    for s in sets:
        args += ["--set", s]
    return main(args), out


def _copy(tables: Path, tmp_path: Path, **edits) -> Path:
    """A copy of the tables folder with ``name=rows`` replaced (``None``: the file left out)."""
    dst = tmp_path / "t"
    dst.mkdir()
    for src in tables.glob("*.csv"):
        rows = edits.get(src.stem.replace("-", "_"), _rows(src))
        if rows is not None:
            _write(dst / src.name, rows)
    return dst


def test_own_tables_train_over_follower_processes(tmp_path: Path, tables: Path, capsys) -> None:
    rc, out = _run(tmp_path, tables, "train.epochs=3", 'train.optimizer="adam"', "train.lr=0.01", kind="grpc")
    assert rc == 0, capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())
    report = json.loads((out / "report.json").read_text())
    leader, follower = (len(_rows(tables / f"{p}.csv")) - 1 for p in ("leader", "follower-1"))
    leader_ids = {r[0] for r in _rows(tables / "leader.csv")[1:]}
    common = leader_ids & {r[0] for r in _rows(tables / "follower-1.csv")[1:]}
    assert s["table_rows"] == {"leader": leader, "follower-1": follower} and s["aligned_samples"] == len(common)
    assert report["data"]["aligned_samples"] == len(common) and s["train_samples"] + len(common) // 5 >= len(common)
    assert s["task"] == "digits-halves" and s["final_test_accuracy"] > 0.5
    assert s["psi"]["follower-1"]["common"] == len(common) and s["psi"]["follower-1"]["bytes_sent"] > 0


def _refused(capsys, rc: int, out: Path, *needles: str) -> None:
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    for n in needles:
        assert n in err, err
    assert not out.exists()


def test_a_leader_table_without_its_id_or_label_column(tmp_path: Path, tables: Path, capsys) -> None:
    rows = _rows(tables / "leader.csv")
    bad = _copy(tables, tmp_path, leader=[["key", *rows[0][1:]], *rows[1:]])
    _refused(capsys, *_run(tmp_path, bad), "'id'", "leader.csv")
    (bad / "leader.csv").unlink()
    _write(bad / "leader.csv", [r[:-1] for r in rows])
    _refused(capsys, *_run(tmp_path, bad), "'label'", "leader.csv")


def test_duplicate_ids_and_a_non_numeric_column(tmp_path: Path, tables: Path, capsys) -> None:
    rows = _rows(tables / "follower-1.csv")
    dup = _copy(tables, tmp_path, follower_1=[*rows, rows[5]])
    _refused(capsys, *_run(tmp_path, dup), "follower-1 refused the task", rows[5][0], "follower-1.csv")
    rows[3][2] = "n/a?"
    (dup / "follower-1.csv").unlink()
    _write(dup / "follower-1.csv", rows)
    _refused(capsys, *_run(tmp_path, dup), "follower-1 refused", f"column '{rows[0][2]}' row 3", "not a number")


def test_no_common_ids_and_too_few(tmp_path: Path, tables: Path, capsys) -> None:
    rows = _rows(tables / "follower-1.csv")
    strangers = _copy(tables, tmp_path, follower_1=[rows[0], *([f"x{r[0]}", *r[1:]] for r in rows[1:])])
    n = len(_rows(tables / "leader.csv")) - 1
    _refused(capsys, *_run(tmp_path, strangers), f"0 of {n:,} ids in common")
    _refused(capsys, *_run(tmp_path, tables, "data.min_common_ids=5000"), f"of {n:,} ids in common",
             "at least 5,000", "data.min_common_ids")


def test_a_follower_whose_table_or_factory_is_missing(tmp_path: Path, tables: Path, capsys) -> None:
    lonely = _copy(tables, tmp_path, follower_1=None)
    _refused(capsys, *_run(tmp_path, lonely, kind="grpc"), "follower-1 refused the task", "follower-1.csv")
    _refused(capsys, *_run(tmp_path, tables, 'follower_tasks.follower-1.factory="nowhere:task"'),
             "follower-1 refused the task", "cannot import 'nowhere'")


def test_a_bottom_output_the_top_cannot_take(tmp_path: Path, tables: Path, capsys) -> None:
    rc, out = _run(tmp_path, tables, "task.args.followers=2")  # the leader's top expects three bottoms
    _refused(capsys, rc, out, "the top model cannot take the bottom models' outputs", "leader (16,)",
             "follower-1 (16,)")


def test_no_party_receives_an_id_it_does_not_hold(tmp_path: Path, tables: Path, monkeypatch) -> None:
    """Every message each party receives in a whole run (the intersection, the proposal, the steps): none
    carries an id that only the other party holds."""
    from sluice.split.party import Worker

    seen: dict[str, list[bytes]] = {"leader": [], "follower": []}
    absorb = Worker._absorb

    def record(self, d):  # noqa: ANN001, ANN202
        if d.payload is not None:
            seen["leader" if self.name == "leader" else "follower"].append(bytes(d.payload))
        return absorb(self, d)

    monkeypatch.setattr(Worker, "_absorb", record)
    rc, _ = _run(tmp_path, tables)
    assert rc == 0
    ids = {p: {r[0] for r in _rows(tables / f"{p}.csv")[1:]} for p in ("leader", "follower-1")}
    only = {"leader": ids["follower-1"] - ids["leader"], "follower": ids["leader"] - ids["follower-1"]}
    for party, payloads in seen.items():
        blob = b"\n".join(payloads)
        assert len(payloads) > 10 and only[party]
        assert not [i for i in only[party] if i.encode() in blob], party
    shared = ids["leader"] & ids["follower-1"]
    assert sum(i.encode() in b"\n".join(seen["follower"]) for i in shared) == len(shared)  # the agreed rows
