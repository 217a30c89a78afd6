"""Model registry: build a network by name, compute its loss, evaluate it.

Models are plain ``torch.nn.Module``s; the runtime sees their parameters as
one flat vector (see :mod:`fedsim.params`).

Example:
    >>> from typing import Annotated, Literal

from pydantic import Field

from fedsim.spec import Spec

_MODEL_INIT_TAG = 0x1A17
    >>> m = build_model(ModelSpec(name="logreg"), input_dim=60, num_classes=10, seed=0)
    >>> sum(p.numel() for p in m.parameters())
    610
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedsim.spec import Spec

_MODEL_INIT_TAG = 0x1A17

__all__ = [
    "ModelSpec",
    "build_model",
    "make_model",
    "QuadraticModel",
    "batch_loss",
    "evaluate",
]


class ModelSpec(Spec):
    """Which network to train. ``hidden`` is used by ``mlp`` only; ``dtype``
    float64 is for exact checks on small problems."""

    name: Literal["logreg", "mlp", "quadratic"] = "logreg"
    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = [200, 200]
    dtype: Literal["float32", "float64"] = "float32"


class QuadraticModel(nn.Module):
    """A parameter vector x; the "batch" holds centres e and curvatures h.

    ``forward(e, h)`` returns the per-sample objective h/2 ||x - e||^2.
    """

    def __init__(self, dim: int, x0: float = 0.0) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.full((dim,), float(x0)))

    def forward(self, e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 0.5 * h * ((self.x - e) ** 2).sum(dim=1)


def _mlp(input_dim: int, hidden: list[int], num_classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = input_dim
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def build_model(
    spec: ModelSpec,
    input_dim: int,
    num_classes: int,
    seed: int,
    x0: float = 0.0,
) -> nn.Module:
    """Build a model with initial weights drawn from ``seed`` (not the global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec.name == "logreg":
            model: nn.Module = nn.Sequential(
                nn.Flatten(), nn.Linear(input_dim, num_classes)
            )
        elif spec.name == "mlp":
            model = _mlp(input_dim, list(spec.hidden), num_classes)
        elif spec.name == "quadratic":
            model = QuadraticModel(input_dim, x0)
        else:
            raise ValueError(f"unknown model {spec.name!r}")
    return model.to(getattr(torch, spec.dtype))


def make_model(scenario, data) -> nn.Module:  # noqa: ANN001
    """The scenario's model for ``data``, initialised from the scenario seed."""
    ss = np.random.SeedSequence([scenario.seed, _MODEL_INIT_TAG])
    seed = int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))
    return build_model(
        scenario.model,
        input_dim=data.input_dim,
        num_classes=data.num_classes,
        seed=seed,
        x0=getattr(scenario.data, "x0", 0.0),
    )


def batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean loss of a minibatch: cross-entropy, or the model's own objective."""
    if isinstance(model, QuadraticModel):
        return model(x, y).mean()
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 4096,
    weights: np.ndarray | None = None,
) -> tuple[float, float]:
    """(mean loss, accuracy) over a dataset, in batches; accuracy is NaN for
    objectives without classes."""
    model.eval()
    n = len(x)
    if n == 0:
        return float("nan"), float("nan")
    if isinstance(model, QuadraticModel):
        per = model(x, y).double()
        w = torch.as_tensor(weights if weights is not None else np.ones(n)).double()
        return float((per * w).sum() / w.sum()), float("nan")
    total_loss, correct = 0.0, 0
    for start in range(0, n, batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        out = model(xb)
        total_loss += float(F.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(dim=1) == yb).sum())
    model.train()
    return total_loss / n, correct / n
