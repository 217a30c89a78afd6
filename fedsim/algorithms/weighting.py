"""The arithmetic every server rule shares: tau_eff, FedNova normalisation and
server momentum (ALGORITHMS.md sections 5.1, 5.3 and 5.4).

Small pure functions on plain floats and tensors, so that FedNova,
FedNova-VR, FedAvg's meter, FedAsync, FedBuff, FedAvgM and the rest compute
the same quantity with the same float operations in the same order: a run's
result does not depend on which algorithm module did the sum.

Example:
    >>> effective_steps("fedavg", [0.25, 0.75], norm_a=[2.0, 6.0], steps=[2, 6])
    5.0
    >>> normalizers([0.5, 0.5], [2.0, 4.0])
    [0.25, 0.125]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from fedsim.algorithms.base import ClientUpdate
from fedsim.lazy import torch

if TYPE_CHECKING:
    from fedsim.solvers import SolverState

__all__ = [
    "TauEff",
    "effective_steps",
    "lr_upload",
    "momentum_buffer",
    "normalizers",
    "updates_tau_eff",
    "uploaded_lr",
    "weighted_steps",
]

# How tau_eff is taken: the weighted mean of ||a_i||_1 (``fedavg``), of the
# local steps tau_i (``steps``, FedNova-Prox), or a constant (``fixed``).
TauEff = Literal["fedavg", "steps", "fixed"]


def weighted_steps(w: Sequence[float], values: Sequence[float]) -> float:
    """sum_i w_i v_i, left to right (no normalisation).

    With ``w`` the round's data weights p_i (summing to 1) and ``values`` the
    ||a_i||_1, this is the tau_eff FedAvg implicitly uses (ALGORITHMS.md 5.1).

    >>> weighted_steps([0.5, 0.5], [2.0, 4.0])
    3.0
    """
    return sum(wi * v for wi, v in zip(w, values, strict=True))


def effective_steps(
    kind: TauEff,
    w: Sequence[float],
    norm_a: Sequence[float],
    steps: Sequence[float],
    fixed: float | None = None,
) -> float:
    """tau_eff = sum_i w_i v_i / sum_i w_i with v = ||a_i||_1 or tau_i, or ``fixed``.

    The weights are normalised here, so unnormalised sampling weights (scheme
    (ii) of ALGORITHMS.md 3) and equal weights (1 each: a plain mean) work.

    >>> effective_steps("steps", [1.0, 1.0], norm_a=[1.9, 3.5], steps=[2, 4])
    3.0
    >>> effective_steps("fixed", [1.0], norm_a=[1.0], steps=[1], fixed=2.5)
    2.5
    """
    if kind == "fixed":
        if fixed is None:
            raise ValueError("tau_eff 'fixed' needs tau_eff_value")
        return float(fixed)
    if kind == "fedavg":
        return weighted_steps(w, norm_a) / float(sum(w))
    if kind == "steps":
        return weighted_steps(w, steps) / float(sum(w))
    raise ValueError(f"unknown tau_eff {kind!r}")


def normalizers(scale: Sequence[float], norm_a: Sequence[float]) -> list[float]:
    """FedNova's per-update factors scale_i / ||a_i||_1.

    ``scale`` is w_i (the sum is then multiplied by tau_eff, as in FedNova)
    or tau_eff for every update (each Delta_i becomes tau_eff Delta_i /
    ||a_i||_1, as in the asynchronous rules). An update that took no step has
    no ||a_i||_1 to divide by.

    >>> normalizers([3.0, 3.0], [1.5, 6.0])
    [2.0, 0.5]
    """
    if any(a <= 0 for a in norm_a):
        raise ValueError("FedNova normalisation needs ||a_i||_1 > 0 (a step taken)")
    return [s / a for s, a in zip(scale, norm_a, strict=True)]


def momentum_buffer(
    buf: torch.Tensor, step: torch.Tensor, beta: float, rescale: float = 1.0
) -> torch.Tensor:
    """Heavy-ball server momentum in parameter units: (beta rescale) buf + step.

    ``rescale`` carries a buffer kept in parameter units across a change of
    the client learning rate: the official FedNova code keeps v in gradient
    units (v <- gmf v + D / lr_t, x <- x - lr_t v), which is this buffer,
    m = -lr_t v, with rescale = lr_t / lr_{t-1}. At a constant lr the
    rescale is exactly 1 and the result is beta buf + step bit for bit.

    >>> momentum_buffer(torch.tensor([2.0]), torch.tensor([1.0]), 0.5)
    tensor([2.])
    >>> momentum_buffer(torch.tensor([2.0]), torch.tensor([1.0]), 0.5, rescale=0.5)
    tensor([1.5000])
    """
    return (beta * rescale) * buf + step


def updates_tau_eff(
    kind: TauEff,
    w: Sequence[float],
    updates: Sequence[ClientUpdate],
    fixed: float | None = None,
) -> float:
    """:func:`effective_steps` over the ||a_i||_1 and tau_i of ``updates``."""
    return effective_steps(
        kind, w, [u.norm_a for u in updates], [u.tau for u in updates], fixed
    )


def lr_upload(solver_state: SolverState) -> dict[str, torch.Tensor]:
    """The extra ``lr``: the client's learning rate this round, for a server
    that turns deltas into gradients (FedPNS) or follows the lr (FedNova's
    server momentum)."""
    return {"lr": torch.tensor(solver_state.lr, dtype=torch.float64)}


def uploaded_lr(update: ClientUpdate) -> float | None:
    """The learning rate a client uploaded as the extra ``lr`` (None if not)."""
    lr = update.extras.get("lr")
    return None if lr is None else float(lr)
