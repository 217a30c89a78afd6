"""The arithmetic server rules share: tau_eff, FedNova normalisation and server
momentum (docs/algorithms.md 5.1, 5.3, 5.4), written once so that every algorithm
does the same float operations in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field

from fedsim.algorithms.base import ClientUpdate, Updates
from fedsim.lazy import torch
from fedsim.solvers import SolverState

# tau_eff: the weighted mean of ||a_i||_1 (``fedavg``), of the local steps
# (``steps``, FedNova-Prox), or a constant (``fixed``).
TauEff = Literal["fedavg", "steps", "fixed"]
Beta = Annotated[float, Field(ge=0, lt=1)]  # a momentum coefficient, in [0, 1)


def weighted_steps(w: Sequence[float], values: Sequence[float]) -> float:
    """sum_i w_i v_i, left to right (FedAvg's implicit tau_eff for p_i, ||a_i||_1)."""
    return sum(wi * v for wi, v in zip(w, values, strict=True))


def effective_steps(
    kind: TauEff,
    w: Sequence[float],
    norm_a: Sequence[float],
    steps: Sequence[float],
    fixed: float | None = None,
) -> float:
    """tau_eff = sum_i w_i v_i / sum_i w_i with v = ||a_i||_1 or tau_i, or ``fixed``.

    >>> effective_steps("fedavg", [0.25, 0.75], norm_a=[2.0, 6.0], steps=[2, 6])
    5.0
    """
    if kind == "fixed":
        if fixed is None:
            raise ValueError("tau_eff 'fixed' needs tau_eff_value")
        return float(fixed)
    if kind in ("fedavg", "steps"):
        return weighted_steps(w, norm_a if kind == "fedavg" else steps) / float(sum(w))
    raise ValueError(f"unknown tau_eff {kind!r}")


def normalizers(scale: Sequence[float], norm_a: Sequence[float]) -> list[float]:
    """FedNova's per-update factors scale_i / ||a_i||_1 (scale: w_i, or tau_eff)."""
    if any(a <= 0 for a in norm_a):
        raise ValueError("FedNova normalisation needs ||a_i||_1 > 0 (a step taken)")
    return [s / a for s, a in zip(scale, norm_a, strict=True)]


def momentum_buffer(
    buf: torch.Tensor, step: torch.Tensor, beta: float, rescale: float = 1.0
) -> torch.Tensor:
    """Heavy-ball server momentum in parameter units: (beta rescale) buf + step.

    ``rescale`` = lr_t / lr_{t-1} follows a changing client lr, as FedNova's
    code does by keeping the buffer in gradient units.

    >>> momentum_buffer(torch.tensor([2.0]), torch.tensor([1.0]), 0.5, rescale=0.5)
    tensor([1.5000])
    """
    return (beta * rescale) * buf + step


def updates_tau_eff(
    kind: TauEff, w: Sequence[float], updates: Updates, fixed: float | None = None
) -> float:
    """:func:`effective_steps` over the ||a_i||_1 and tau_i of ``updates``."""
    norm_a, steps = [u.norm_a for u in updates], [u.tau for u in updates]
    return effective_steps(kind, w, norm_a, steps, fixed)


def lr_upload(solver_state: SolverState) -> dict[str, torch.Tensor]:
    """The extra ``lr``: the client's learning rate this round."""
    return {"lr": torch.tensor(solver_state.lr, dtype=torch.float64)}


def uploaded_lr(update: ClientUpdate) -> float | None:
    """The learning rate a client uploaded as the extra ``lr`` (None if not)."""
    lr = update.extras.get("lr")
    return None if lr is None else float(lr)
