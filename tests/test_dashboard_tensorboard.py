"""``--log-to tensorboard DIR``: a run's metrics also as TensorBoard event files, read back with TensorBoard's
own reader and compared with the run's ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sluice import tensorboard as tb
from sluice.cli import main


@pytest.fixture(autouse=True)
def _reset_log_to():
    yield
    tb.configure(None)  # process-wide: leave no sink behind for other tests


def test_a_run_writes_its_metrics_as_tensorboard_scalars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--out", "runs/tb", "--log-to", "tensorboard", "tb", "--set", "train.rounds=6",
                 "--set", "data.num_clients=5", "--set", "model.hidden=[16]"])
    assert code == 0
    lines = [json.loads(x) for x in (tmp_path / "runs" / "tb" / "metrics.jsonl").read_text().splitlines() if x]
    acc = EventAccumulator(str(tmp_path / "tb" / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"test_accuracy", "train_loss", "bytes/cum_up", "bytes/cum_down", "bytes/up"} <= tags
    got = acc.Scalars("test_accuracy")
    assert [e.step for e in got] == [r["round"] for r in lines] == list(range(1, 7))
    assert [e.value for e in got] == pytest.approx([r["test_accuracy"] for r in lines], rel=1e-6)
    assert acc.Scalars("bytes/cum_up")[-1].value == lines[-1]["cum_bytes_up"]


def test_an_unknown_kind_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "--log-to", "wandb", str(tmp_path)]) == 2
    assert "unknown" in capsys.readouterr().err
