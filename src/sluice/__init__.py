"""Sluice: train models across parties that cannot pool their data or bandwidth."""

__version__ = "0.1.0"
