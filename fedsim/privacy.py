"""Client-level differential privacy: DP-FedAvg, accounted for who took part.

A scenario's ``privacy`` section turns on DP-FedAvg (McMahan et al., ICLR
2018, "Learning Differentially Private Recurrent Language Models"):

- every client's update is clipped to the L2 norm ``clip_norm`` C on the
  worker, after ``client_finish`` and any compression, so what the server
  aggregates is bounded whatever the worker (:func:`privatise`);
- the server adds Gaussian noise to the rule's weighted sum of the updates
  (:class:`CentralNoise`): std ``noise_multiplier`` z times C on the sum of
  the clients' contributions, each at most C, scaled as the rule scales
  them, i.e. ``z C max_i w_i`` on ``sum_i w_i delta_i`` (z C / n for n
  equal weights); with ``noise: local`` each client adds N(0, (z C)^2) to
  its own clipped update instead, and the server adds none;
- the privacy spent, epsilon at ``delta``, after each round, comes from
  Opacus' accountants (``accountant: rdp`` or ``prv``), never from a
  formula of fedsim's own (:class:`Ledger`).

Amplification by sampling (a client's epsilon shrinks when it takes part
with a small probability q) holds only when who takes part is a uniform
draw that owes nothing to the device: :func:`amplification` grants the
sample rate q = E[k_i] of a selector that declares equal inclusion for
every client and does not learn from rounds, under a round policy and a
fleet that lose no update in a way that depends on the device (no deadline,
no over-selection, no devices offline, equal dropout, time for a step in
every window). Otherwise the accountant runs with q = 1 (no amplification)
and rounds.parquet and summary.json say why.

Randomness: the server's noise from (seed, round), a client's local noise
from (seed, round, client), each with a tag of its own, so any number of
workers, a server actor and ``--resume`` draw the same. The accountant's
state is the number of rounds (every round spends the same), so a resume
needs nothing from the checkpoint.

Opacus is an optional extra (``pip install 'fedsim[privacy]'``): a scenario
with a ``privacy`` section is refused in one line without it.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

import numpy as np
from pydantic import Field

from fedsim.errors import RunError
from fedsim.lazy import torch
from fedsim.selectors.bernoulli import mean_draws
from fedsim.spec import NonNegFloat, PosFloat, Spec

if TYPE_CHECKING:
    from fedsim.algorithms.base import Algorithm, ClientUpdate
    from fedsim.clock import RoundSpec, RunContext
    from fedsim.compression import Compressor
    from fedsim.fleet import Fleet
    from fedsim.selectors.base import Selector, SelectorContext

EXTRA = "pip install 'fedsim[privacy]'"


class PrivacyError(RunError, ValueError):
    """The accountant could not say what a round spent: the run stops with
    this one line (exit 1), naming the field to change."""


class DPScenario(Protocol):
    """What the accountant reads of a scenario (``fedsim.scenario.Scenario``,
    which imports this module: a protocol, so it is not imported back)."""

    @property
    def privacy(self) -> PrivacySpec | None: ...
    @property
    def selector(self) -> Selector: ...
    @property
    def algorithm(self) -> Algorithm: ...
    @property
    def round(self) -> RoundSpec: ...


# Tags separating the noise streams from the minibatches' and compression's
# (the same seeds, another tag each).
_CENTRAL_TAG = 0xD1FF
_LOCAL_TAG = 0xD10C


class PrivacySpec(Spec):
    """The scenario's ``privacy`` section (docs/scenarios.md, docs/fleets.md
    "Differential privacy").

    Attributes:
        noise_multiplier: z, the Gaussian noise's std in units of the clip
            norm (0: clipping only, epsilon infinite).
        clip_norm: C, the L2 norm every client's update is clipped to.
        delta: the delta at which epsilon is reported, in (0, 1).
        noise: ``central`` (the server noises the sum, DP-FedAvg) or
            ``local`` (each client noises its own update).
        accountant: Opacus' ``rdp`` (Renyi DP, Mironov 2017) or ``prv``
            (privacy random variables, Gopi et al. 2021: tighter, slower).
    """

    noise_multiplier: NonNegFloat
    clip_norm: PosFloat
    delta: Annotated[float, Field(gt=0, lt=1)] = 1e-5
    noise: Literal["central", "local"] = "central"
    accountant: Literal["rdp", "prv"] = "rdp"


def scenario_problem(
    spec: PrivacySpec | None,
    algorithm: Algorithm,
    compression: Compressor | None,
    round_: RoundSpec,
) -> str | None:
    """Why the scenario cannot run with its ``privacy`` section (a line
    naming the field, before any training), or None.

    Args:
        spec: the section (None: no DP, nothing to check).
        algorithm: the rule; its ``sums_updates`` must be declared.
        compression: the compressor, if any.
        round_: the round policy.
    """
    if spec is None:
        return None
    if importlib.util.find_spec("opacus") is None:
        return (
            "privacy.accountant: needs Opacus, an optional extra that is not "
            f"installed: {EXTRA}"
        )
    if round_.policy == "async":
        return (
            "round.policy 'async': the privacy section accounts rounds, and "
            "asynchronous runs have none (use fixed_epochs or fixed_window)"
        )
    if not algorithm.sums_updates:
        return (
            f"algorithm.name {algorithm.name!r}: its server step is not a "
            "weighted sum of the clients' updates, so the privacy section's "
            "clipping and noise would bound nothing (use fedavg, fedprox, "
            "fedavgm or fedadam, or remove the privacy section)"
        )
    if spec.noise == "local" and compression is not None:
        return (
            "privacy.noise 'local' makes every update dense, so compression "
            f"{compression.name!r} would no longer describe what is sent "
            "(use noise: central, or remove the compression section)"
        )
    return None


# ------------------------------------------------------------ the client side
def clip(delta: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``delta`` scaled down to L2 norm ``clip_norm`` when longer (as is
    otherwise): the norm taken in float64, so the result's norm is at most
    ``clip_norm`` up to the rounding of ``delta``'s dtype.

    >>> clip(torch.tensor([3.0, 4.0]), 1.0).tolist()
    [0.6000000238418579, 0.800000011920929]
    """
    norm = float(torch.linalg.vector_norm(delta.to(torch.float64)))
    if norm <= clip_norm:
        return delta
    return (delta.to(torch.float64) * (clip_norm / norm)).to(delta.dtype)


def privatise(spec: PrivacySpec, delta: torch.Tensor, client_seed: int) -> torch.Tensor:
    """What a client sends under DP: its update clipped to C and, with
    ``noise: local``, plus N(0, (z C)^2) per coordinate from the client's
    own generator (its minibatch seed and a tag of its own).

    Args:
        spec: the privacy section.
        delta: the update (after compression, if any).
        client_seed: the client's seed of this round (seed, round, client).
    """
    out = clip(delta, spec.clip_norm)
    if spec.noise != "local" or spec.noise_multiplier == 0:
        return out
    gen = _generator([client_seed, _LOCAL_TAG])
    std = spec.noise_multiplier * spec.clip_norm
    return out + _gaussian(out, std, gen)


def _generator(entropy: list[int]) -> torch.Generator:
    """A CPU generator seeded from ``entropy`` through NumPy's SeedSequence."""
    seed = np.random.SeedSequence(entropy).generate_state(1)[0]
    return torch.Generator().manual_seed(int(seed))


def _gaussian(like: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    """N(0, std^2) shaped and typed like ``like``, drawn on the CPU (the
    same bits on every worker), then moved to ``like``'s device."""
    z = torch.randn(like.shape, generator=gen, dtype=like.dtype)
    return (z * std).to(like.device)


# ------------------------------------------------------------ the server side
@dataclass(frozen=True)
class CentralNoise:
    """The server's half of DP-FedAvg: Gaussian noise on the rule's sum.

    Attributes:
        spec: the privacy section (``noise: central``).
        seed: the scenario's seed; round t's noise comes from (seed, t).
    """

    spec: PrivacySpec
    seed: int

    def std(self, weights: Sequence[float]) -> float:
        """The noise's std on ``sum_i w_i delta_i``: z C on the sum of the
        contributions, each at most C, scaled by the largest weight (a
        client's largest share of the step): z C / n for n equal weights.

        >>> spec = PrivacySpec(noise_multiplier=2.0, clip_norm=0.5)
        >>> CentralNoise(spec, 0).std([0.25] * 4)
        0.25
        """
        return self.spec.noise_multiplier * self.spec.clip_norm * max(weights)

    def add(
        self, algorithm: Algorithm, updates: Sequence[ClientUpdate], round_: int
    ) -> list[ClientUpdate]:
        """The updates a rule sums to ``sum_i w_i delta_i + xi``, xi ~
        N(0, std^2) drawn from (seed, round): each delta gets ``xi / sum_i
        w_i``, so the rule's own weights carry the noise into its step
        exactly once (a server optimiser then works on the noised sum).

        Args:
            algorithm: the rule (``step_weights`` gives its w_i).
            updates: the step's updates, in the order the rule gets them.
            round_: the round, which seeds the noise.

        Returns:
            New updates (the originals, which rows and selectors read,
            are left alone); the same list when there is nothing to noise.
        """
        if not updates or self.spec.noise_multiplier == 0:
            return list(updates)
        w = algorithm.step_weights(updates)
        total = float(sum(w))
        gen = _generator([self.seed, round_, _CENTRAL_TAG])
        xi = _gaussian(updates[0].delta, self.std(w), gen) / total
        return [replace(u, delta=u.delta + xi.to(u.delta.dtype)) for u in updates]


def central_noise(spec: PrivacySpec | None, seed: int) -> CentralNoise | None:
    """The server's noise for a run (None: no DP, or noise added locally)."""
    if spec is None or spec.noise != "central":
        return None
    return CentralNoise(spec, seed)


# ------------------------------------------------------------ amplification
@dataclass(frozen=True)
class Amplification:
    """What the accountant may assume of who takes part in a round.

    Attributes:
        sample_rate: q, each client's probability of taking part (1: no
            amplification).
        kind: ``poisson`` (independent inclusion), ``fixed_cohort`` (k of m
            uniformly, accounted as Poisson with q = k / m, as Opacus and
            TF Privacy account fixed-size batches) or ``none``.
        why: the selection's facts that grant it, or why none is granted.
    """

    sample_rate: float
    kind: Literal["poisson", "fixed_cohort", "none"]
    why: str


def amplification(
    sc: DPScenario, fleet: Fleet, comm_s: np.ndarray, ctx: SelectorContext
) -> Amplification:
    """The amplification a run's selection grants, from declared facts: the
    noise, the selector's class variables and ``expected_draws``, the round
    policy's fields and the fleet's availability, dropout and stragglers.

    Args:
        sc: the scenario (its ``privacy`` section set).
        fleet: the run's devices.
        comm_s: each device's download plus upload seconds.
        ctx: the run's selector context (data weights, speeds).
    """
    spec = sc.privacy
    assert spec is not None
    checks = (
        lambda: _noise_why(spec),
        lambda: _selector_why(sc.selector, sc.algorithm),
        lambda: _round_why(sc.round),
        lambda: _window_why(sc.round, fleet, comm_s),
        lambda: _fleet_why(fleet),
    )
    for check in checks:
        if (why := check()) is not None:
            return Amplification(1.0, "none", why)
    return _granted(sc.selector, ctx)


def _noise_why(spec: PrivacySpec) -> str | None:
    """Local noise: the server sees each noised update and who sent it."""
    if spec.noise == "local":
        return (
            "privacy.noise 'local': the server sees each client's noised "
            "update and who sent it, so sampling hides nothing from it"
        )
    return None


def _selector_why(sel: Selector, algorithm: Algorithm) -> str | None:
    """Why the selection is not a uniform draw blind to the run, or None."""
    name, kind = sel.name, type(sel)
    if algorithm.chooses is not None:
        return f"algorithm.name {algorithm.name!r} chooses the round's clients itself"
    if sel.adaptive:
        return (
            f"selector.name {name!r} chooses from what earlier rounds taught it "
            "(it observes results): who takes part is not a uniform draw"
        )
    if kind.with_replacement or kind.data_share_in_sample:
        return (
            f"selector.name {name!r} favours clients by their data share: "
            "inclusion is not uniform"
        )
    return None


def _round_why(round_: RoundSpec) -> str | None:
    """Why the round policy loses updates in a way that depends on the
    device (a deadline, over-selection), or None."""
    if round_.deadline_s is not None:
        return (
            f"round.deadline_s {round_.deadline_s:g}: updates that miss the "
            "deadline are lost, and which depends on the device (speed, "
            "link, stragglers)"
        )
    if round_.over_select > 1:
        return (
            f"round.over_select {round_.over_select:g} keeps the first "
            "arrivals: fast devices take part more often"
        )
    return None


def _window_why(round_: RoundSpec, fleet: Fleet, comm_s: np.ndarray) -> str | None:
    """Under ``fixed_window`` a device with no time for a step sends
    nothing: why some may (stragglers, or a device too slow), or None."""
    if round_.policy != "fixed_window":
        return None
    if np.any(fleet.straggler_p > 0):
        return (
            "fleet stragglers under round.policy 'fixed_window': a slowed "
            "device may have no time for a step, and which depends on the device"
        )
    steps = (round_.window_s - comm_s) * fleet.speed
    if np.any(steps < 1):
        device = int(np.argmax(steps < 1))
        return (
            f"round.window_s {round_.window_s:g}: device {device} has no time "
            "for a step, so some devices never take part"
        )
    return None


def _fleet_why(fleet: Fleet) -> str | None:
    """Why the fleet decides who can take part (devices offline, unequal
    dropout), or None."""
    kinds = {a.kind for a in fleet.availability}
    if fleet.intervals or kinds != {"always"}:
        return (
            "fleet availability: devices go offline, and the round draws "
            "among those online, so inclusion depends on the device"
        )
    dropout = fleet.dropout_p
    if dropout is not None and dropout.size and np.ptp(dropout) > 0:
        return (
            "fleet stragglers.dropout_p differs between groups: which updates "
            "are lost depends on the device"
        )
    return None


def _granted(sel: Selector, ctx: SelectorContext) -> Amplification:
    """The amplification of a selector that passed the checks: its declared
    inclusion probabilities, when they are equal for every client."""
    draws = sel.expected_draws(ctx)
    name = sel.name
    if draws is None or not len(draws) or np.ptp(draws) > 1e-12 * draws.max():
        return Amplification(
            1.0,
            "none",
            f"selector.name {name!r} declares no equal inclusion probability "
            "for every client (expected_draws)",
        )
    q, m = float(draws[0]), ctx.num_clients
    if type(sel).fixed_count:
        k = min(sel.clients_per_round, m)
        why = f"selector {name!r} draws a fixed cohort of {k} of {m} uniformly"
        return Amplification(q, "fixed_cohort", why)
    # a random count is drawn as bernoulli's: redrawn when empty, which
    # raises each client's inclusion from q to q / (1 - (1 - q)^m)
    rate = min(1.0, q * mean_draws(q, m))
    why = (
        f"selector {name!r} includes every client independently with q = "
        f"{q:g}, redrawn when empty: {rate:.6g}"
    )
    return Amplification(rate, "poisson", why)


# ------------------------------------------------------------ accounting
@dataclass(frozen=True)
class Ledger:
    """The privacy a run spends, round by round, from Opacus' accountant.

    Every round is one step of the subsampled Gaussian mechanism with the
    same (z, q), so the spend after round t is a pure function of t (and a
    resume needs no saved state). With ``rdp`` the Renyi DP of one step is
    computed once by Opacus (``compute_rdp``) and scaled by the steps, as
    ``RDPAccountant`` sums it over its history, then converted by Opacus'
    ``get_privacy_spent``: the same numbers as stepping an
    ``RDPAccountant`` t + 1 times. With ``prv`` an Opacus
    ``PRVAccountant`` holds the history.

    Attributes:
        spec: the privacy section.
        amp: what sampling grants.
    """

    spec: PrivacySpec
    amp: Amplification

    @property
    def noise_multiplier(self) -> float:
        """z, as the accountant sees it: with local noise a client's update
        may change by 2C (any update against any other), so z / 2."""
        z = self.spec.noise_multiplier
        return z / 2 if self.spec.noise == "local" else z

    def epsilon(self, steps: int) -> float:
        """Epsilon at ``spec.delta`` after ``steps`` rounds (inf with no
        noise)."""
        z, q = self.noise_multiplier, self.amp.sample_rate
        if z == 0:
            return math.inf
        if self.spec.accountant == "prv":
            return self._prv(z, q, steps)
        orders, unit = _rdp_unit(z, q)
        from opacus.accountants.analysis import rdp

        eps, _ = rdp.get_privacy_spent(
            orders=orders, rdp=unit * steps, delta=self.spec.delta
        )
        return float(eps)

    def _prv(self, z: float, q: float, steps: int) -> float:
        """Epsilon from an Opacus ``PRVAccountant`` holding ``steps`` steps.

        Raises:
            PrivacyError: Opacus could not compute it (its discretisation
                fails for some (z, q, steps)), naming the field to change.
        """
        from opacus.accountants import PRVAccountant

        prv = PRVAccountant()
        prv.history = [(z, q, steps)]
        try:
            return float(prv.get_epsilon(self.spec.delta))
        except (ValueError, RuntimeError, OverflowError) as exc:
            raise PrivacyError(
                f"privacy.accountant 'prv': Opacus could not compute epsilon "
                f"after {steps} rounds ({exc}); use accountant: rdp"
            ) from None

    def columns(self, t: int) -> dict[str, float | str]:
        """Round ``t``'s rounds.parquet columns: epsilon spent after it
        (every round counts, an empty one too: the draw happened), delta,
        the sample rate and the amplification's kind and reason."""
        return {
            "dp_epsilon": self.epsilon(t + 1),
            "dp_delta": self.spec.delta,
            "dp_sample_rate": self.amp.sample_rate,
            "dp_amplification": self.amp.kind,
            "dp_why": self.amp.why,
        }


@functools.cache
def _rdp_unit(z: float, q: float) -> tuple[list[float], np.ndarray]:
    """Opacus' orders and the Renyi DP of one step of (z, q) at each
    (computed once per pair: Opacus' sum over orders is the slow part)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp

    orders = list(RDPAccountant.DEFAULT_ALPHAS)
    unit = rdp.compute_rdp(q=q, noise_multiplier=z, steps=1, orders=orders)
    return orders, np.asarray(unit, dtype=np.float64)


def ledger(
    sc: DPScenario, fleet: Fleet, run: RunContext, ctx: SelectorContext
) -> Ledger | None:
    """A run's ledger (None without a ``privacy`` section).

    Args:
        sc: the scenario.
        fleet: the run's devices.
        run: the run's constants (the bytes each device moves a round).
        ctx: the run's selector context.
    """
    if sc.privacy is None:
        return None
    ids = np.arange(fleet.size)
    down, up = fleet.comm_time(ids, run.bytes_down, run.up_bytes(ids))
    return Ledger(sc.privacy, amplification(sc, fleet, down + up, ctx))


def summary_entry(
    sc: DPScenario, rows: Sequence[dict[str, object]]
) -> dict[str, object]:
    """summary.json's ``privacy`` (only for a run with a ``privacy``
    section: other summaries stay as they were): the section, the epsilon
    spent after the last round recorded, and the amplification granted."""
    spec = sc.privacy
    if spec is None:
        return {}
    last = rows[-1] if rows else {}
    entry = {
        **spec.model_dump(),
        "epsilon": last.get("dp_epsilon"),
        "rounds_accounted": len(rows),
        "sample_rate": last.get("dp_sample_rate"),
        "amplification": last.get("dp_amplification"),
        "why": last.get("dp_why"),
    }
    return {"privacy": entry}
