"""Base class and constrained types for the typed, frozen parts of a scenario.

Specs that belong to a plug-in (a dataset, an algorithm, a selector) live in
that plug-in's module, so a hyperparameter is declared once, where it is used;
:mod:`fedsim.scenario` assembles them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Spec", "PLUGIN_CONFIG", "PosFloat", "NonNegFloat", "Prob", "PosInt"]


class Spec(BaseModel):
    """Frozen, rejects unknown keys and non-finite numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# For plug-ins written as frozen dataclasses (algorithms, selectors): pydantic
# validates their fields (and runs __post_init__) when a scenario is loaded.
PLUGIN_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Prob = Annotated[float, Field(ge=0, le=1)]
PosInt = Annotated[int, Field(ge=1)]
