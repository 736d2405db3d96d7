"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def digits():
    """The digits dataset, split with seed 0."""
    from sluice.data import load_dataset

    return load_dataset("digits", seed=0)
