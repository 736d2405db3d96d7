"""Horizontal federated learning with bidirectional sparse compression (SPEC C)."""

from sluice.hfl.engine import HFLEngine

__all__ = ["HFLEngine"]
