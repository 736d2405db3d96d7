"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def digits():
    """The digits dataset, split with seed 0."""
    from sluice.data import load_dataset

    return load_dataset("digits", seed=0)


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """One ``sluice serve`` (real loopback port, real SQLite file) shared by the service and consumer tests;
    see tests/test_service_support.py. Its whole process group is ended afterwards."""
    from test_service_support import running_server

    tmp = tmp_path_factory.mktemp("service")
    extra = ("--set", "policy.default_iterations=4", "--set", "policy.plateau_patience=50")
    with running_server(tmp, extra=extra) as s:
        yield s
