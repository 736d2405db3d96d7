"""Base of every configuration and request section (pydantic): unknown keys are errors; and the value
patterns that several sections share."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"
"""What a ``train.device`` setting accepts (:func:`sluice.models.device.resolve_device` resolves it)."""


class Section(BaseModel):
    """Unknown keys are errors; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
