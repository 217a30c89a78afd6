"""A one-hidden-layer perceptron, as a model plug-in: its fields are the
scenario's ``model`` section; it builds the network and counts its parameters
by formula (so ``fedsim validate`` and the memory check need no torch)."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from fedsim.api import Model


class TinyMLP(Model):
    """flatten -> Linear(d, hidden) -> tanh -> Linear(hidden, classes).

    >>> TinyMLP(hidden=4).param_count((10,), 3)   # 10*4 + 4 + 4*3 + 3
    59
    """

    hidden: Annotated[int, Field(ge=1, le=4096)] = 16

    def build(self, input_shape: tuple[int, ...], num_classes: int):  # noqa: ANN201
        """The network (torch is imported here, not when the scenario loads)."""
        from torch import nn

        if num_classes < 1:
            raise ValueError("TinyMLP classifies: it needs a dataset with classes")
        d = math.prod(input_shape)
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(d, self.hidden),
            nn.Tanh(),
            nn.Linear(self.hidden, num_classes),
        )

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int:
        d, h = math.prod(input_shape), self.hidden
        return d * h + h + h * num_classes + num_classes
