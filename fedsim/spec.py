"""Base class and constrained types for the typed, frozen parts of a scenario.

A plug-in's spec lives in its module; :class:`ModelSpec` lives here, not in
:mod:`fedsim.models`, so that validating a scenario does not import torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Spec(BaseModel):
    """Frozen, rejects unknown keys and non-finite numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# For plug-ins written as frozen dataclasses (algorithms, selectors).
PLUGIN_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Prob = Annotated[float, Field(ge=0, le=1)]
PosInt = Annotated[int, Field(ge=1)]

Width = Annotated[int, Field(ge=1, le=65536)]


class ModelSpec(Spec):
    """Which network to train (docs/scenarios.md, "model"; docs/datasets.md)."""

    name: Literal[
        "logreg",
        "mlp",
        "quadratic",
        "cnn",
        "cifar_cnn",
        "vgg11",
        "resnet18",
        "convnet",
        "lstm",
    ] = "logreg"
    hidden: list[Width] = [200, 200]
    norm_groups: Width = 2
    width: Width = 128
    depth: Annotated[int, Field(ge=1, le=16)] = 3
    embed_dim: Width = 8
    lstm_hidden: Width = 256
    lstm_layers: Annotated[int, Field(ge=1, le=16)] = 2
    dtype: Literal["float32", "float64"] = "float32"

    @property
    def elem_bytes(self) -> int:
        """Bytes per parameter (what a model vector costs to send or store)."""
        return 8 if self.dtype == "float64" else 4
