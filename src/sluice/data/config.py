"""The ``[data]`` section of a federated task: which dataset, how many clients, how it is partitioned."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.schema import Section


class DataConfig(Section):
    dataset: Literal["digits", "breast_cancer", "mnist", "synthetic"] = "digits"
    num_clients: int = Field(20, ge=1, le=100_000)
    partition: Literal["iid", "dirichlet", "shards"] = "dirichlet"
    alpha: float = Field(0.3, gt=0, description="Dirichlet concentration (smaller = more skew)")
    shards_per_client: int = Field(2, ge=1)
    test_fraction: float = Field(0.2, gt=0, lt=1)
    synthetic_alpha: float = Field(1.0, ge=0, description="FedProx Synthetic(alpha, beta): model skew")
    synthetic_beta: float = Field(1.0, ge=0, description="FedProx Synthetic(alpha, beta): data skew")
