"""Shared base for profile models: unknown keys are errors, instances are immutable."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Port = Annotated[int, Field(ge=1, le=65535)]
PositiveFloat = Annotated[float, Field(gt=0)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
