"""The ``[data]`` section of a federated task: which dataset, how many clients, how it is partitioned.

``dataset`` is an embedded dataset (``digits``, ``breast_cancer``, ``mnist``), FedProx's ``synthetic``, or
a network-analytics scenario (``coverage``, ``energy``, ``kpi_anomaly``; :mod:`sluice.data.scenarios`).
A scenario is sized by the ``[data.scenario]`` table, checked against the scenario's own parameter
section (an unknown or bad key is named); it brings its own parties (one client per site/gNB or cell),
its own held-out rows and its own model type, so ``partition``, ``alpha``, ``shards_per_client`` and
``test_fraction`` do not apply to it. ``partition``, ``alpha``, ``shards_per_client`` and ``num_clients``
default to the task's own :class:`~sluice.tasks.Partition` (Dirichlet(0.3) over 20 clients for the built-in
datasets); a scenario has one client per party, and a given ``num_clients`` must equal that number.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo

from sluice.schema import Section

DEFAULT_CLIENTS = 20
"""Clients of a partitioned dataset when ``num_clients`` is not given."""


def scenario_params(dataset: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` checked against the parameter section of scenario ``dataset``, with every default filled
    in; ``ValueError`` naming each bad key, or when ``dataset`` is no scenario but parameters are given.
    (``dataset`` None — itself invalid — passes ``params`` through for its own error to be reported.)"""
    from sluice.config import format_validation_error
    from sluice.data import scenarios

    if dataset is None:
        return params
    if dataset not in scenarios.SCENARIO_NAMES:
        if params:
            raise ValueError(f"generator parameters are for the scenarios ({', '.join(scenarios.SCENARIO_NAMES)}); "
                             f"dataset {dataset!r} takes none")
        return params
    section = scenarios.get_spec(dataset).params
    try:
        return section.model_validate(params).model_dump(mode="json")
    except ValidationError as exc:
        lines = format_validation_error(exc).split("\n  ")[1:]
        raise ValueError(f"{dataset} parameters: " + "; ".join(lines)) from None


def _checked_scenario(params: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    return scenario_params(info.data.get("dataset"), params)


ScenarioTable = Annotated[dict[str, Any], AfterValidator(_checked_scenario),
                          Field(description="generator parameters of a scenario dataset (its own section)")]
"""The ``[data.scenario]`` table of a data section whose ``dataset`` field comes before it: checked by
:func:`scenario_params` against that dataset."""


class DataConfig(Section):
    dataset: str = Field("digits", description="a built-in dataset; the engines' sections name those they train "
                         "(sluice.tasks.config)")
    num_clients: int | None = Field(
        None, ge=1, le=100_000,
        description=f"clients; default {DEFAULT_CLIENTS}, or a scenario's parties (a given value must equal them)",
    )
    partition: Literal["iid", "dirichlet", "shards"] | None = Field(
        None, description="how Sluice splits a task's one training set; default: the task's (dirichlet for the "
                          "built-in datasets, shards for mnist_cnn)")
    alpha: float | None = Field(None, gt=0, description="Dirichlet concentration (smaller = more skew); default: "
                                "the task's (0.3)")
    shards_per_client: int | None = Field(None, ge=1, description="shards of one label per client; default: the "
                                          "task's (2)")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of an embedded dataset held out for testing")
    synthetic_alpha: float = Field(1.0, ge=0, description="FedProx Synthetic(alpha, beta): model skew")
    synthetic_beta: float = Field(1.0, ge=0, description="FedProx Synthetic(alpha, beta): data skew")
    scenario: ScenarioTable = Field(default_factory=dict)

    @property
    def is_scenario(self) -> bool:
        """Whether ``dataset`` is a generated network-analytics scenario."""
        from sluice.data.scenarios import SCENARIO_NAMES

        return self.dataset in SCENARIO_NAMES
