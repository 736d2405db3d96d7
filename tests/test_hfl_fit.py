"""Compression fitted to the user's task (adaptive optimizers, normalisation layers, small models) and the
notes a run makes of it and of a stall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import sluice
from sluice.config import load_config
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.hfl.fit import ADAPTIVE_DOWN_BUDGET, DOWN_MIN, STALL_ROUNDS, UP_MIN, StallWatch, fit_compression


def _data(n: int, seed: int, noise_labels: bool = False) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = torch.randint(0, 4, (n,), generator=g) if noise_labels else (x[:, :4].argmax(dim=1))
    return TensorDataset(x, y)


def _task(optimizer=None, norm: bool = False, hidden: int = 200, noise_labels: bool = False) -> sluice.Task:
    def model() -> nn.Module:
        layers = [nn.Linear(8, hidden), *([nn.LayerNorm(hidden)] if norm else []), nn.ReLU(), nn.Linear(hidden, 4)]
        return nn.Sequential(*layers)

    return sluice.Task(model=model, train=_data(400, 0, noise_labels), test=_data(200, 1, noise_labels),
                       optimizer=optimizer, partition=sluice.Partition(method="iid", num_clients=4), name="toy")


def _adam(params, lr):
    return torch.optim.Adam(params, lr=lr)


def _fit(task: sluice.Task, *overrides: str):
    cfg = load_config(None, list(overrides), HFLConfig)
    return fit_compression(cfg, task, task.model())


def test_plain_sgd_without_normalisation_keeps_the_measured_defaults():
    cfg, notes = _fit(_task())
    assert notes == []
    assert (cfg.compression.up_ratio, cfg.compression.down_budget, cfg.compression.down_adapt) == (0.02, 0.02, 1.0)


def test_an_adaptive_optimizer_on_a_small_model_gets_larger_budgets_and_a_note():
    task = _task(optimizer=_adam)
    d = sum(p.numel() for p in task.model().parameters())
    cfg, (note,) = _fit(task)
    c = cfg.compression
    assert c.up_ratio == pytest.approx(UP_MIN / d)
    assert c.down_budget == pytest.approx(DOWN_MIN / (d * cfg.train.participation))
    assert "Adam" in note and "compression.up_ratio 0.02 →" in note and "up_min" in note


def test_normalisation_layers_alone_set_the_minimums_not_the_adaptive_budget():
    big = _task(norm=True, hidden=8192)  # the ratios give more than the minimums: nothing changes
    cfg, notes = _fit(big)
    assert notes == [] and cfg.compression.up_ratio == 0.02
    cfg, (note,) = _fit(_task(norm=True))
    assert "LayerNorm" in note and cfg.compression.up_ratio > 0.02


def test_an_adaptive_optimizer_on_a_large_model_raises_only_the_step_budget():
    cfg, (note,) = _fit(_task(optimizer=_adam, hidden=4096))
    c = cfg.compression
    assert (c.down_budget, c.down_adapt, c.up_ratio) == (ADAPTIVE_DOWN_BUDGET, 0.0, 0.02)
    assert "compression.down_budget 0.02 → 0.05, compression.down_adapt 1 → 0" in note


def test_a_model_of_embedding_tables_keeps_the_defaults_under_adam():
    task = sluice.Task(model=lambda: nn.Sequential(nn.EmbeddingBag(20_000, 16), nn.Linear(16, 4)),
                       train=TensorDataset(torch.randint(0, 20_000, (40, 6)), torch.randint(0, 4, (40,))),
                       test=TensorDataset(torch.randint(0, 20_000, (8, 6)), torch.randint(0, 4, (8,))),
                       optimizer=_adam)
    cfg, notes = _fit(task)
    assert notes == [] and (cfg.compression.down_budget, cfg.compression.down_adapt) == (0.02, 1.0)


def test_every_choice_can_be_overridden():
    task = _task(optimizer=_adam, norm=True)
    cfg, notes = _fit(task, "compression.down_budget=0.02", "compression.down_adapt=1", "compression.up_min=0",
                      "compression.down_min=0")
    c = cfg.compression
    assert notes == [] and (c.up_ratio, c.down_budget, c.down_adapt) == (0.02, 0.02, 1.0)
    cfg, notes = _fit(task, "compression.up=dense", "compression.down=dense")
    assert notes == []


def test_the_engine_trains_with_the_fitted_budget_and_the_report_says_why(tmp_path: Path, capsys):
    code = sluice.run_task(_task(optimizer=_adam), {"train": {"rounds": 2, "lr": 0.01}}, out=tmp_path / "run")
    assert code == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    (note,) = report["notes"]
    assert "fitted to task 'toy'" in note
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("notes") for r in records] == [[note], None]  # said once
    assert "note" in capsys.readouterr().out
    engine = HFLEngine(load_config(None, ["train.rounds=1"], HFLConfig), _task(optimizer=_adam))
    engine.start()
    assert engine.cfg.compression.up_ratio > 0.02 and engine.notes() == [note]


def test_a_stall_is_noted_once_after_its_rounds():
    watch = StallWatch(_task(), compressed=True)
    level = watch.level
    notes = [watch.observe(r, {"test_accuracy": level}) for r in range(1, STALL_ROUNDS + 3)]
    assert notes[:STALL_ROUNDS - 1] == [None] * (STALL_ROUNDS - 1)
    assert "stalled" in notes[STALL_ROUNDS - 1] and "compression.up_min" in notes[STALL_ROUNDS - 1]
    assert notes[STALL_ROUNDS:] == [None, None]
    fresh = StallWatch(_task(), compressed=True)  # a round above the level starts the count again
    seq = [level] * (STALL_ROUNDS - 1) + [level + 0.2] + [level] * (STALL_ROUNDS - 1)
    assert all(fresh.observe(r, {"test_accuracy": v}) is None for r, v in enumerate(seq, 1))
    dense = StallWatch(_task(), compressed=False)
    assert all(dense.observe(r, {"test_accuracy": level}) is None for r in range(1, 2 * STALL_ROUNDS))


def test_a_run_that_cannot_learn_reports_its_stall(tmp_path: Path):
    """Labels independent of the inputs: the test accuracy stays at the level of a constant predictor."""
    code = sluice.run_task(_task(noise_labels=True), {"train": {"rounds": STALL_ROUNDS + 2}}, out=tmp_path / "r")
    assert code == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert any(n.startswith("stalled: test_accuracy") for n in report["notes"]), report["notes"]
