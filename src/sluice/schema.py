"""Base of every configuration and request section (pydantic): unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
