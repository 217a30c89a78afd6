"""Local solvers: how a client turns gradients into local steps.

Each updates a flat parameter vector in place, one step at a time (the clock
decides how many), keeping FedNova's recursion (docs/algorithms.md 5.3) for
||a_i||_1, the L1 norm of its accumulation vector (Delta_i = -lr G_i a_i);
``norm_a(tau)`` is the closed form (5.2). With ``SolverState.lr`` an algorithm
gets d_i = -Delta_i / (lr ||a_i||_1) (SCAFFOLD option II, FedNova-VR, FedDC).

Each solver also steps a stack of clients at once (:meth:`SGD.step_rows`,
used by :mod:`fedsim.batched`): the same rule on rows ``[n, d]``, with
||a_i||_1 taken from the closed form instead of the recursion.

Example:
    >>> s = Momentum(lr=0.1, rho=0.9)
    >>> x, st = torch.zeros(1), s.begin(torch.zeros(1))
    >>> for _ in range(2):
    ...     s.step(x, torch.ones(1), st)
    >>> round(st.norm_a, 6), round(s.norm_a(2), 6)
    (2.9, 2.9)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from fedsim.lazy import torch

if TYPE_CHECKING:
    from torch import Tensor

    from fedsim.spec import ClientSpec


@dataclass
class SolverState:
    """Per-client, per-round solver state (reset every round)."""

    x0: torch.Tensor  # the round's starting (global) parameters
    lr: float = 0.0  # the solver's base learning rate
    steps: int = 0
    norm_a: float = 0.0  # s in the FedNova recursion
    counter: float = 0.0  # c in the FedNova recursion (momentum only)
    buf: torch.Tensor | None = field(default=None, repr=False)


@dataclass(frozen=True)
class SGD:
    """Vanilla SGD with optional coupled weight decay: x <- x - lr (g + wd x);
    with ``clip_norm`` the gradient g is first clipped to that L2 norm.

    A subclass is trained one client at a time unless it declares
    ``stacks = True``, which promises that :meth:`step_rows` (with
    :meth:`lr_at` and :meth:`row_buffer`) applies the same rule as
    :meth:`step` to a stack of clients.

    Attributes:
        lr: the learning rate (the round's, after the schedule).
        weight_decay: the coupled weight decay coefficient.
        clip_norm: the largest L2 norm a minibatch gradient keeps (None: no
            clipping); stacked, fedsim.batched clips each client's row.
    """

    lr: float
    weight_decay: float = 0.0
    clip_norm: float | None = None

    # step_rows implements this class's rule (fedsim.batched may stack it)
    stacks: ClassVar[bool] = True
    # every step is x <- x - lr_at(s) g, no other state: a dense stack may
    # take it inside its backward pass (fedsim.batched's fused path). A
    # subclass is plain while it keeps SGD's step_rows, unless it says.
    plain: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A new rule inherits SGD's step_rows; stacking it before it says it
        # overrides that would silently train another rule.
        if "stacks" not in cls.__dict__:
            cls.stacks = False
        # ... and a rule of its own in step_rows fused as plain SGD would too
        if "plain" not in cls.__dict__:
            cls.plain = cls.step_rows is SGD.step_rows

    def begin(self, x0: torch.Tensor) -> SolverState:
        """A fresh state for a round that starts from ``x0``."""
        return SolverState(x0=x0, lr=self.lr)

    def _direction(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if self.clip_norm is not None:
            g = clip_gradient(g, self.clip_norm)
        return g.add(x, alpha=self.weight_decay) if self.weight_decay else g

    def step(self, x: torch.Tensor, g: torch.Tensor, st: SolverState) -> None:
        """One local step on ``x`` in place, advancing ``st``'s recursion.

        Args:
            x: the client's parameters (updated in place).
            g: the minibatch gradient at ``x`` (after the algorithm's hook).
            st: the client's round state (steps, ||a||_1, buffers).
        """
        x.add_(self._direction(x, g), alpha=-self.lr)
        st.norm_a += 1.0
        st.steps += 1

    def lr_at(self, s: int) -> float:
        """The learning rate of local step ``s`` (0-based)."""
        return self.lr

    def row_buffer(self, theta: torch.Tensor) -> torch.Tensor | None:
        """The stacked state :meth:`step_rows` needs for ``theta``'s rows
        (None: none)."""
        return None

    def step_rows(
        self, s: int, theta: Tensor, g: Tensor, x0: Tensor, buf: Tensor | None
    ) -> None:
        """Step ``s`` of this rule on rows ``[n, d]`` of a stack, in place.

        Args:
            s: the 0-based local step (every row is at the same step).
            theta: the rows' parameters (updated in place).
            g: their gradients (may be changed in place).
            x0: the round's starting parameters ``[d]`` (proximal rules).
            buf: the first n rows of :meth:`row_buffer`'s state, or None.
        """
        theta.add_(self._direction(theta, g), alpha=-self.lr_at(s))

    def norm_a(self, tau: int) -> float:
        """||a||_1 after ``tau`` steps, in closed form (docs/algorithms.md 5.2)."""
        return float(tau)


@dataclass(frozen=True)
class Momentum(SGD):
    """Heavy-ball momentum, buffer reset each round: u <- rho u + g; x <- x - lr u."""

    rho: float = 0.9

    stacks: ClassVar[bool] = True

    def step(self, x: torch.Tensor, g: torch.Tensor, st: SolverState) -> None:
        d = self._direction(x, g)
        if st.buf is None:
            st.buf = d.clone()
        else:
            st.buf.mul_(self.rho).add_(d)
        x.add_(st.buf, alpha=-self.lr)
        st.counter = self.rho * st.counter + 1.0
        st.norm_a += st.counter
        st.steps += 1

    def row_buffer(self, theta: torch.Tensor) -> torch.Tensor | None:
        return torch.zeros_like(theta)

    def step_rows(
        self, s: int, theta: Tensor, g: Tensor, x0: Tensor, buf: Tensor | None
    ) -> None:
        assert buf is not None
        # buf is 0 before the first step, so rho 0 + d equals step()'s clone
        d = buf.mul_(self.rho).add_(self._direction(theta, g))
        theta.add_(d, alpha=-self.lr)

    def norm_a(self, tau: int) -> float:
        r = self.rho
        return (tau - r * (1.0 - r**tau) / (1.0 - r)) / (1.0 - r)


@dataclass(frozen=True)
class Prox(SGD):
    """Proximal SGD (docs/algorithms.md 4): x <- x - lr (g + mu (x - x0))."""

    mu: float = 0.0

    stacks: ClassVar[bool] = True

    def step(self, x: torch.Tensor, g: torch.Tensor, st: SolverState) -> None:
        d = self._direction(x, g)
        if self.mu:
            d = d + self.mu * (x - st.x0)
        x.add_(d, alpha=-self.lr)
        st.norm_a = (1.0 - self.lr * self.mu) * st.norm_a + 1.0
        st.steps += 1

    def step_rows(
        self, s: int, theta: Tensor, g: Tensor, x0: Tensor, buf: Tensor | None
    ) -> None:
        d = self._direction(theta, g)
        if self.mu:
            d = d + self.mu * (theta - x0)
        theta.add_(d, alpha=-self.lr)

    def norm_a(self, tau: int) -> float:
        a = self.lr * self.mu
        return (1.0 - (1.0 - a) ** tau) / a if a else float(tau)


@dataclass(frozen=True)
class Decay(SGD):
    """lr decaying inside the round: lr_k = lr gamma^k, a = [1, ..., gamma^(tau-1)]."""

    gamma: float = 1.0

    stacks: ClassVar[bool] = True

    def step(self, x: torch.Tensor, g: torch.Tensor, st: SolverState) -> None:
        factor = self.gamma**st.steps
        x.add_(self._direction(x, g), alpha=-self.lr * factor)
        st.norm_a += factor
        st.steps += 1

    def lr_at(self, s: int) -> float:
        return self.lr * self.gamma**s

    def norm_a(self, tau: int) -> float:
        gamma = self.gamma
        return (1.0 - gamma**tau) / (1.0 - gamma) if gamma != 1.0 else float(tau)


def clip_gradient(g: torch.Tensor, max_norm: float) -> torch.Tensor:
    """g scaled by min(1, max_norm / (||g||_2 + 1e-6)), as
    ``torch.nn.utils.clip_grad_norm_`` (the FedDC and FedDyn codes, max_norm =
    10, clip after the loss's penalty terms, before the optimizer's weight
    decay); ``g`` itself when the norm is within the bound (no copy).

    >>> clip_gradient(torch.tensor([3.0, 4.0]), 1.0)
    tensor([0.6000, 0.8000])
    >>> clip_gradient(torch.tensor([3.0, 4.0]), 10.0)
    tensor([3., 4.])
    """
    coef = max_norm / (float(torch.linalg.vector_norm(g)) + 1e-6)
    return g * coef if coef < 1.0 else g


def step_factor(fractions: list[float], round_: int, rounds: int) -> float:
    """0.1 to the number of fractions f with ``round_ >= f * rounds``: the
    step schedule ``client.lr_steps`` (rounds counted from 0).

    >>> [round(step_factor([0.5, 0.75], t, 8), 12) for t in (0, 3, 4, 5, 6, 7)]
    [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    """
    passed = sum(round_ >= f * rounds for f in fractions)
    return 0.1**passed if passed else 1.0


def normalized_gradient(delta: torch.Tensor, st: SolverState) -> torch.Tensor:
    """d = -Delta / (lr ||a||_1): the round's a-weighted average gradient.

    >>> st = SolverState(x0=torch.zeros(1), lr=0.5, steps=2, norm_a=2.0)
    >>> normalized_gradient(torch.tensor([-3.0]), st)
    tensor([3.])
    """
    return average_gradient(delta, st.lr, st.norm_a)


def average_gradient(delta: torch.Tensor, lr: float, norm_a: float) -> torch.Tensor:
    """d = -Delta / (lr ||a||_1) from an uploaded delta, lr and ||a||_1.

    Args:
        delta: the client's model change Delta.
        lr: the learning rate its steps used.
        norm_a: ||a||_1 of its solver after its steps (> 0).

    >>> average_gradient(torch.tensor([-3.0]), 0.5, 2.0)
    tensor([3.])
    """
    return delta / (-lr * norm_a)


def make_solver(spec: ClientSpec, mu: float | None = None) -> SGD:
    """The solver a client spec asks for; ``mu`` (FedProx's mu, FedAsync's rho)
    forces ``prox``, refused with momentum or decay (no derived ||a||_1).

    >>> from fedsim.scenario import ClientSpec
    >>> make_solver(ClientSpec(solver="decay", lr=0.1, step_decay=0.5)).norm_a(3)
    1.75
    """
    if mu is None or mu <= 0:
        mu = spec.mu if spec.solver == "prox" else None
    elif spec.solver in ("momentum", "decay"):
        raise ValueError(
            f"a proximal term (mu = {mu}) with the {spec.solver!r} solver has "
            "no derived ||a||_1 (docs/algorithms.md 5.3); use client.solver: sgd, "
            "or set the algorithm's proximal coefficient (mu, rho) to 0"
        )
    wd, clip = spec.weight_decay, spec.clip_norm
    if mu is not None:
        return _prox(spec, mu)
    if spec.solver == "sgd":
        return SGD(lr=spec.lr, weight_decay=wd, clip_norm=clip)
    if spec.solver == "momentum":
        return Momentum(lr=spec.lr, weight_decay=wd, clip_norm=clip, rho=spec.momentum)
    if spec.solver == "decay":
        return Decay(lr=spec.lr, weight_decay=wd, clip_norm=clip, gamma=spec.step_decay)
    raise ValueError(f"unknown solver {spec.solver!r}")


def _prox(spec: ClientSpec, mu: float) -> Prox:
    """The proximal solver for coefficient ``mu`` > 0.

    Raises:
        ValueError: lr mu >= 2, where each proximal step overshoots.
    """
    # lr mu >= 2: x - x0 grows each step and ||a||_1 <= 0 (FedNova divides by it)
    if spec.lr * mu >= 2:
        raise ValueError(
            f"client.lr * mu = {spec.lr * mu:g} is 2 or more: each proximal "
            "step overshoots the global model and the gap grows (||a||_1 <= 0, "
            "docs/algorithms.md 5.3); lower client.lr or the proximal coefficient"
        )
    return Prox(
        lr=spec.lr, weight_decay=spec.weight_decay, clip_norm=spec.clip_norm, mu=mu
    )
