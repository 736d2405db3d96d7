"""Configuration of plain centralised training (``sluice local``): one task trained in one place.

The task is ``[task]`` (:mod:`sluice.tasks.config`), by default the built-in MLP task of ``[data] dataset``:
an embedded dataset or a network-analytics scenario (``coverage``, ``energy``, ``kpi_anomaly``) sized by
``[data.scenario]``; a scenario's train rows of every party are pooled (the centralised model) and its own
held-out rows are the test set, so ``test_fraction`` does not apply to it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.data.config import ScenarioTable
from sluice.schema import DEVICE_PATTERN, Section
from sluice.tasks.config import TABULAR_NAMES, TaskConfig

LOCAL_NAMES = tuple(n for n in TABULAR_NAMES if n != "synthetic")
"""The built-in datasets of local training (FedProx's synthetic data is made for clients)."""


class LocalData(Section):
    dataset: Literal[LOCAL_NAMES] = "digits"
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of an embedded dataset held out for testing")
    max_train_samples: int | None = Field(None, ge=1, description="start with only this many samples")
    scenario: ScenarioTable = Field(default_factory=dict)


class LocalModel(Section):
    hidden: list[int] = Field(default_factory=lambda: [64], description="hidden layers of a built-in MLP task")


class LocalTrain(Section):
    iterations: int = Field(30, ge=1, description="epochs; the default iteration limit of a job")
    lr: float = Field(0.05, gt=0, description="learning rate (the default SGD optimizer's)")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (the default optimizer)")
    batch_size: int = Field(32, ge=1, description="minibatch size")
    min_samples: int = Field(1, ge=0, description="fewer samples = inadequate training data")
    device: str = Field("cpu", pattern=DEVICE_PATTERN, description="where training runs: auto, cpu, cuda or cuda:N")


class LocalConfig(Section):
    seed: int = Field(0, description="seeds the split, the model and the batch order")
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: LocalData = Field(default_factory=LocalData)
    model: LocalModel = Field(default_factory=LocalModel)
    train: LocalTrain = Field(default_factory=LocalTrain)
