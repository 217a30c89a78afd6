"""Base class and constrained types for the typed, frozen parts of a scenario.

Specs that belong to a plug-in (a dataset, an algorithm, a selector) live in
that plug-in's module, so a hyperparameter is declared once, where it is used;
:mod:`fedsim.scenario` assembles them. :class:`ModelSpec` is the exception:
it lives here and not in :mod:`fedsim.models` (which re-exports it), so that
validating a scenario does not import torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Spec",
    "PLUGIN_CONFIG",
    "PosFloat",
    "NonNegFloat",
    "Prob",
    "PosInt",
    "ModelSpec",
]


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

Width = Annotated[int, Field(ge=1, le=65536)]


class ModelSpec(Spec):
    """Which network to train (see the table in :mod:`fedsim.models`).

    Attributes:
        name: the network.
        hidden: ``mlp`` hidden widths.
        norm_groups: GroupNorm groups per layer of ``vgg11`` and ``resnet18``
            (2, as in Hsieh et al. 2020 and the FedDC code's ResNet).
        width, depth: ``convnet`` channels and blocks (FedDM: 128, 3).
        embed_dim, lstm_hidden, lstm_layers: ``lstm`` sizes (LEAF: 8, 256, 2).
        dtype: float64 is for exact checks on small problems.
    """

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
