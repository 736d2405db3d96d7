"""Network-analytics scenarios generated from standard radio and energy models (see each module).

``load_scenario("coverage", {"rings": 2}, seed=0)`` validates the parameters against the scenario's own
section, generates (or reads from the cache) and returns a :class:`ScenarioData`.
"""

from __future__ import annotations

import importlib
from typing import Any

from sluice.data.scenarios.base import ScenarioData, ScenarioSpec, load_cached, scaled_metric_fns
from sluice.errors import DataError

SCENARIO_NAMES: tuple[str, ...] = ("coverage", "energy", "kpi_anomaly")


def get_spec(name: str) -> ScenarioSpec:
    """The :class:`ScenarioSpec` of scenario ``name``."""
    if name not in SCENARIO_NAMES:
        raise DataError(f"unknown scenario {name!r}; allowed: {', '.join(SCENARIO_NAMES)}")
    return importlib.import_module(f"sluice.data.scenarios.{name}").SPEC


def load_scenario(name: str, params: dict[str, Any] | None = None, seed: int = 0, *,
                  cache: bool = True) -> ScenarioData:
    """Scenario ``name`` generated with ``params`` (its section's defaults for missing keys) and ``seed``."""
    from sluice.config import validate

    spec = get_spec(name)
    return load_cached(spec, validate(spec.params, dict(params or {})), seed, cache=cache)


__all__ = ["SCENARIO_NAMES", "ScenarioData", "ScenarioSpec", "get_spec", "load_scenario", "scaled_metric_fns"]
