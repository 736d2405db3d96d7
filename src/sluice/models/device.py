"""Where a party trains: ``device = "auto" | "cpu" | "cuda" | "cuda:N"``.

``auto`` is the first CUDA GPU when torch sees one, else the CPU. Naming ``cuda`` on a machine without a
GPU, a GPU index that does not exist or anything else is a :class:`~sluice.errors.ConfigError` before
training. Devices change where arithmetic happens, never the bytes: flat views, checkpoints, the wire and
saved models are float32 numpy arrays on the CPU.
"""

from __future__ import annotations

import re

import torch

from sluice.errors import ConfigError
from sluice.schema import DEVICE_PATTERN


def resolve_device(spec: str) -> torch.device:
    """The ``torch.device`` that ``spec`` names on this machine (see the module docstring)."""
    if not isinstance(spec, str) or not re.match(DEVICE_PATTERN, spec):
        raise ConfigError(f"unknown device {spec!r}; allowed: auto, cpu, cuda, cuda:N")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {spec!r}: this machine has no CUDA GPU that torch can use; use device = "
                          "\"cpu\" or \"auto\"")
    index = int(spec.split(":")[1]) if ":" in spec else 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return torch.device("cuda", index)
