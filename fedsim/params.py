"""Small pure functions on flat parameter vectors (how every model travels).

Sums over clients run in float64 in the order given (client id), so results do
not depend on which worker trained which client.

Example:
    >>> import torch
    >>> from fedsim import params
    >>> params.weighted_sum([torch.ones(2), 3 * torch.ones(2)], [0.25, 0.75])
    tensor([2.5000, 2.5000])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedsim.lazy import torch

if TYPE_CHECKING:
    from torch import nn


def num_params(model: nn.Module) -> int:
    """d, the number of scalars in ``model``'s parameters."""
    return sum(p.numel() for p in model.parameters())


def flatten(model: nn.Module) -> torch.Tensor:
    """A copy of the model's parameters as one vector (in the model's dtype)."""
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def bind_flat(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make ``model``'s parameters and gradients views into two flat buffers.

    Returns ``(theta, grad)``: writing ``theta`` changes the model and
    ``loss.backward()`` accumulates into ``grad``. Zero it with ``grad.zero_()``
    (``model.zero_grad()`` would detach the views).
    """
    theta = flatten(model)
    grad = torch.zeros_like(theta)
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    for p, t, g in zip(params, theta.split(sizes), grad.split(sizes), strict=True):
        p.data, p.grad = t.view_as(p), g.view_as(p)
    return theta, grad


def weighted_sum(
    vectors: Sequence[torch.Tensor],
    weights: Sequence[float],
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """sum_i w_i v_i accumulated in float64, in the given order; the result has
    ``dtype``, by default the first vector's.

    The fixed order and the float64 accumulator make an aggregate the same
    bits whatever order updates arrived in (the caller sorts them).

    Args:
        vectors: equally shaped tensors.
        weights: one weight per vector.
        dtype: the result's dtype (None: the first vector's).

    Raises:
        ValueError: no vectors, or not one weight per vector.
    """
    if len(vectors) != len(weights):
        raise ValueError(f"{len(vectors)} vectors but {len(weights)} weights")
    if not vectors:
        raise ValueError("weighted_sum of no vectors")
    acc = torch.zeros(vectors[0].shape, dtype=torch.float64)
    for v, w in zip(vectors, weights, strict=True):
        acc.add_(v.to(torch.float64), alpha=float(w))
    return acc.to(vectors[0].dtype if dtype is None else dtype)


def l2_norm(v: torch.Tensor) -> float:
    """||v||_2, computed in float64 whatever ``v``'s dtype."""
    return float(torch.linalg.vector_norm(v.to(torch.float64)))


def chi2(p: Sequence[float], w: Sequence[float]) -> float:
    """chi^2(p || w) = sum_i (p_i - w_i)^2 / w_i  (FedNova, Theorems 1-2), after
    normalising both to sum 1; infinite where some w_i = 0 < p_i.

    >>> round(chi2([0.5, 0.5], [0.25, 0.75]), 12)
    0.333333333333
    """
    sp, sw = float(sum(p)), float(sum(w))
    if sp <= 0 or sw <= 0:
        return float("nan")
    pairs = [(pi / sp, wi / sw) for pi, wi in zip(p, w, strict=True)]
    if any(wi == 0 < pi for pi, wi in pairs):
        return float("inf")
    return sum(((pi - wi) ** 2 / wi for pi, wi in pairs if wi != 0), 0.0)
