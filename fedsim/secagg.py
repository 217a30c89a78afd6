"""Secure aggregation's cost on the clock: SecAgg and SecAgg+.

fedsim does not run the cryptography: the server still sums the plain
updates, so the aggregate is the one a secure-aggregation server would
unmask. What this module adds is what the protocol costs, in bytes over each
client's link, in compute on each client and in compute on the server, and
the one way it changes the outcome: a round whose survivors fall below the
threshold ``t`` fails (the server cannot unmask the sum: no aggregate is
applied, the global model stays as it was, and rounds.parquet says why).

The protocols (a scenario's ``secure_aggregation`` section, docs/fleets.md,
"Secure aggregation"):

- ``secagg``: Bonawitz et al., "Practical Secure Aggregation for
  Privacy-Preserving Machine Learning", CCS 2017. Every client agrees a
  pairwise mask with each of the other n - 1 and Shamir-shares its two
  secrets (its mask key and its self-mask seed) among them. The paper's
  asymptotic costs (its Section 7): client compute O(n^2 + m n),
  communication O(n + m); server compute O(m n^2), communication
  O(n^2 + m n), for n clients and vectors of m elements.
- ``secagg_plus``: Bell et al., "Secure Single-Server Aggregation with
  (Poly)Logarithmic Overhead", CCS 2020. The complete graph is replaced by
  one of degree k = O(log n): client compute O(log^2 n + m log n),
  communication O(log n + m); server compute O(n log^2 n + m n log n).

One round of either, as billed here, for a cohort of n chosen devices, each
with k neighbours (n - 1 for ``secagg``):

1. *Advertise keys*: a client uploads 2 public keys and downloads its k
   neighbours' 2 keys each.
2. *Share keys*: it computes 2 key agreements per neighbour, Shamir-shares
   its 2 secrets into k shares at threshold ``t_k``, and uploads k encrypted
   shares; it downloads the k encrypted shares its neighbours made for it.
3. *Masked input*: it expands k pairwise masks and one self mask of m
   elements each with a PRG and uploads its masked vector, whose elements
   are ``ceil(log2 n)`` bits wider than the update's so that the sum of n of
   them does not wrap (Bonawitz et al. Section 3: inputs in Z_R with R large
   enough for the sum).
4. *Unmasking*: after the collection closes, each survivor downloads which
   of its neighbours dropped and uploads one share per neighbour (of the
   self-mask seed of a survivor, of the mask key of a dropped client). The
   server reconstructs every survivor's self-mask seed and every dropped
   client's mask key, recomputes the dropped clients' pairwise masks with
   their surviving neighbours, and removes all of them from the sum: the
   term that grows with the number dropped.

Phases 1 to 3 go into each device's job (their bytes over its link, their
compute at its CPU's clock, before its training: they shorten a
``fixed_window`` round's training time); phase 4 is an exchange after the
collection closes (the slowest survivor's download and upload), then the
server's compute, billed at the scenario's ``server`` speed
(:mod:`fedsim.servertime`; a free server, the default, bills it nothing).

Constants: every size and cycle count is a field of :class:`SecAggCosts`
(a scenario can override each); each default says where it comes from,
``[assumed]`` where it is this model's engineering assumption rather than a
figure of the papers. Compute is counted in CPU cycles: a client's at its
CPU clock ``client_hz``, the server's turned into FLOP-equivalents by
``flops_per_cycle`` and billed at its FLOP/s like its other work.

Simplifications, stated: every chosen device completes phases 1 and 2 (they
come first and are small), so a device lost later is dropped *after*
sharing its keys; a survivor also answers phase 4; the threshold is the
cohort's (``secagg_plus``'s per-neighbourhood reconstruction is billed with
the expected number of a dropped client's surviving neighbours, k s/(n-1),
not over a drawn graph).

Example:
    >>> spec = SecAggSpec(protocol="secagg", threshold=3)
    >>> model = SecAggModel(spec, elements=10, elem_bytes=4)
    >>> c = model.cohort(4)
    >>> c.neighbours, c.threshold, c.masked_bytes      # 10 x (32 + 2) bits
    (3, 3, 43)
    >>> c.bytes_up, c.bytes_down                      # phases 1 to 3, over the plain 40
    (319, 444)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, field_validator

from fedsim.clock import RoundPlan, RunContext
from fedsim.fleet import Fleet
from fedsim.rows import Row, number
from fedsim.spec import Spec

# The drop reason of a survivor of a failed round: its masked input reached
# the server, which could not unmask the sum (clients.parquet's drop_reason).
ABORTED = "aborted"


class SecAggCosts(Spec):
    """The constants of the cost model, each with its source.

    Sizes are in bytes, compute in CPU cycles (``flops_per_cycle`` turns a
    cycle into FLOP-equivalents, to bill it at a FLOP/s speed).

    Attributes:
        key_bytes: one public key: 32, an X25519 public key (RFC 7748).
            Bonawitz et al. agree keys by elliptic-curve Diffie-Hellman; the
            curve is [assumed].
        id_bytes: one client index in a message: 4 [assumed] (int32).
        key_share_bytes: one Shamir share of a client's mask (secret) key:
            32, the key's own size (a share is one element of a field as
            large as the secret).
        seed_share_bytes: one Shamir share of a self-mask seed: 16, a
            128-bit PRG seed (Bonawitz et al. use AES in counter mode as the
            PRG; the key size is [assumed]).
        aead_bytes: the authenticated encryption's overhead on one
            encrypted share: 28, AES-GCM's 12-byte nonce and 16-byte tag
            (NIST SP 800-38D).
        key_agreement_cycles: one key generation or agreement (one scalar
            multiplication on the curve): 120,000 [assumed] (X25519 on one
            x86-64 core is of that order).
        shamir_cycles: one term of Shamir arithmetic (a multiply-add in the
            share field, making a share or interpolating one): 20 [assumed].
        aead_cycles_per_byte: encrypting or decrypting a share: 4
            [assumed] (AES-GCM, per byte, with set-up).
        prg_cycles_per_byte: expanding a mask with the PRG and adding it to
            the vector: 1.5 [assumed] (AES-CTR with hardware AES is about
            1 cycle a byte; the add is the rest).
        client_hz: the cycles a second a client's CPU gives the protocol:
            2e9 [assumed] (one phone core at 2 GHz). The cryptography runs
            on the CPU whatever trains the model, so it is billed at this
            clock times the device's straggler slowdown of the round, not
            at its training speed.
        flops_per_cycle: FLOP-equivalents of one cycle on the server: 16
            [assumed] (one 256-bit FMA unit: 8 FP32 lanes, 2 FLOPs each), so
            its cycles are billed at the ``server`` speed in FLOP/s.
        neighbour_factor: ``secagg_plus``'s k = ceil(neighbour_factor
            log2 n) neighbours when ``neighbours`` is not given: 3
            [assumed]; Bell et al. prove k = O(log n) suffices.
    """

    key_bytes: Annotated[int, Field(ge=1)] = 32
    id_bytes: Annotated[int, Field(ge=1)] = 4
    key_share_bytes: Annotated[int, Field(ge=1)] = 32
    seed_share_bytes: Annotated[int, Field(ge=1)] = 16
    aead_bytes: Annotated[int, Field(ge=0)] = 28
    key_agreement_cycles: Annotated[float, Field(ge=0)] = 120_000.0
    shamir_cycles: Annotated[float, Field(ge=0)] = 20.0
    aead_cycles_per_byte: Annotated[float, Field(ge=0)] = 4.0
    prg_cycles_per_byte: Annotated[float, Field(ge=0)] = 1.5
    client_hz: Annotated[float, Field(gt=0)] = 2.0e9
    flops_per_cycle: Annotated[float, Field(gt=0)] = 16.0
    neighbour_factor: Annotated[float, Field(gt=0)] = 3.0

    @property
    def share_message_bytes(self) -> int:
        """One encrypted share message of phase 2: sender and receiver ids,
        a share of each secret, and the encryption's overhead."""
        return (
            2 * self.id_bytes
            + self.key_share_bytes
            + self.seed_share_bytes
            + self.aead_bytes
        )


class SecAggSpec(Spec):
    """The scenario's ``secure_aggregation`` section.

    Attributes:
        protocol: ``secagg`` (Bonawitz et al. 2017) or ``secagg_plus``
            (Bell et al. 2020).
        threshold: how many survivors the server needs to unmask the sum:
            a count (an integer, at most ``selector.clients_per_round``) or
            a fraction of the round's cohort (a float in (0, 1]: ceil of
            fraction times the devices chosen).
        neighbours: ``secagg_plus``: each client's neighbour count k (None:
            ``costs.neighbour_factor`` log2 n, at most n - 1).
        costs: the cost model's constants.
    """

    protocol: Literal["secagg", "secagg_plus"]
    threshold: int | float
    neighbours: Annotated[int, Field(ge=1)] | None = None
    costs: SecAggCosts = SecAggCosts()

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, v: int | float) -> int | float:
        """A count at least 1, or a fraction in (0, 1]."""
        if isinstance(v, bool):
            raise ValueError("must be a count (an integer) or a fraction")
        if isinstance(v, int):
            if v < 1:
                raise ValueError("a count must be at least 1")
            return v
        if not 0 < v <= 1:
            raise ValueError(f"{v} is not a fraction in (0, 1] (a count is an integer)")
        return v

    def cohort_threshold(self, n: int) -> int:
        """t for a cohort of ``n`` devices (a count as given; a fraction's
        ceil, with ``round(.., 9)`` so that 0.3 * 10 asks for 3, not 4)."""
        if isinstance(self.threshold, int):
            return self.threshold
        return max(1, math.ceil(round(self.threshold * n, 9)))

    def problem(self, clients_per_round: int, policy: str) -> str | None:
        """Why the scenario cannot run with this section (a field named),
        or None.

        Args:
            clients_per_round: the selector's k (the most survivors a round
                can have).
            policy: ``round.policy``.
        """
        if policy == "async":
            return (
                "secure_aggregation needs synchronous rounds (round.policy "
                "fixed_window or fixed_epochs): its masks cancel only in the sum "
                "over a cohort that shared keys in one round, and an asynchronous "
                "server has no cohort"
            )
        t = self.threshold
        if isinstance(t, int) and t > clients_per_round:
            return (
                f"secure_aggregation.threshold: {t} is above the cohort "
                f"(selector.clients_per_round: {clients_per_round}); no round "
                "could unmask its sum"
            )
        return None


@dataclass(frozen=True)
class Cohort:
    """The costs of one round that depend only on its cohort size n.

    Attributes:
        n: the devices chosen (they all share keys).
        neighbours: k, each client's neighbours (n - 1 for ``secagg``).
        threshold: t, the survivors needed.
        share_threshold: t_k, the shares needed to rebuild one secret
            (t for ``secagg``; ceil(t k / n) for ``secagg_plus``).
        masked_bytes: a masked upload (replacing the plain one).
        bytes_up: a client's extra upload over the plain one, phases 1-3.
        bytes_down: its extra download, phases 1-2.
        client_s: its compute, phases 1-3, in seconds at ``client_hz``
            (before a straggler's slowdown).
    """

    n: int
    neighbours: int
    threshold: int
    share_threshold: int
    masked_bytes: int
    bytes_up: int
    bytes_down: int
    client_s: float


@dataclass(frozen=True)
class RoundCost:
    """What secure aggregation did and cost in one round.

    Attributes:
        failed: the survivors fell below the threshold (nothing applied).
        reason: why it failed, in words ("" when it did not).
        survivors: the devices whose masked inputs the server kept.
        dropped: the chosen devices that shared keys and then dropped.
        unmask_bytes_up: a survivor's phase-4 upload.
        unmask_bytes_down: a survivor's phase-4 download.
        unmask_s: phase 4's exchange, the slowest survivor's (0 if failed).
        server_flops: the server's phase-4 compute, FLOP-equivalents.
        columns: the round's rounds.parquet columns (docs/results.md).
    """

    failed: bool
    reason: str
    survivors: int
    dropped: int
    unmask_bytes_up: int
    unmask_bytes_down: int
    unmask_s: float
    server_flops: float
    columns: Row = dataclasses.field(default_factory=dict)


class SecAggModel:
    """Secure aggregation's costs for one run.

    Guarantees: every cost is a pure function of (the section, the model's
    size, the round's plan), so a round's seconds and columns are the same
    with any number of workers and through ``--resume``.

    Args:
        spec: the ``secure_aggregation`` section.
        elements: m, the elements of a client's plain upload (the
            algorithm's upload bytes over ``elem_bytes``).
        elem_bytes: bytes of one plain element.
        server_rate: the server's FLOP/s (inf: its work is free).
    """

    def __init__(
        self,
        spec: SecAggSpec,
        elements: int,
        elem_bytes: int,
        server_rate: float = math.inf,
    ) -> None:
        self.spec = spec
        self.costs = spec.costs
        self.m = elements
        self.elem_bytes = elem_bytes
        self.server_rate = server_rate

    def neighbours(self, n: int) -> int:
        """k: n - 1 for ``secagg``; for ``secagg_plus`` the section's
        ``neighbours`` or ceil(neighbour_factor log2 n), at most n - 1."""
        if self.spec.protocol == "secagg":
            return max(0, n - 1)
        k = self.spec.neighbours
        if k is None:
            k = math.ceil(round(self.costs.neighbour_factor * math.log2(max(n, 1)), 9))
        return max(0, min(n - 1, k))

    def cohort(self, n: int) -> Cohort:
        """The costs of a round of ``n`` chosen devices (phases 1 to 3).

        Each client: uploads 2 keys and k share messages, downloads 2 keys
        and a share message per neighbour; computes 2 key generations, 2
        agreements per neighbour, 2 secrets into k shares of t_k terms,
        k encryptions and k decryptions, and k + 1 masks of m elements;
        its masked elements are ceil(log2 n) bits wider.
        """
        c, k = self.costs, self.neighbours(n)
        t = self.spec.cohort_threshold(n)
        t_k = t if self.spec.protocol == "secagg" else max(1, math.ceil(t * k / n))
        wide_bits = 8 * self.elem_bytes + (n - 1).bit_length()  # + ceil(log2 n)
        masked = math.ceil(self.m * wide_bits / 8)
        msg = c.share_message_bytes
        up = 2 * c.key_bytes + k * msg + masked - self.m * self.elem_bytes
        down = k * (2 * c.key_bytes + msg)
        cycles = (
            (2 + 2 * k) * c.key_agreement_cycles
            + 2 * k * t_k * c.shamir_cycles
            + 2 * k * msg * c.aead_cycles_per_byte
            + (k + 1) * self._mask_cycles(n)
        )
        return Cohort(n, k, t, t_k, masked, up, down, cycles / c.client_hz)

    def _mask_cycles(self, n: int) -> float:
        """Cycles to expand one mask of m ring elements and add it."""
        wide_bits = 8 * self.elem_bytes + (n - 1).bit_length()
        return self.m * wide_bits / 8 * self.costs.prg_cycles_per_byte

    def context(self, ctx: RunContext, n: int) -> RunContext:
        """The run's clock constants for a round of ``n`` chosen devices:
        phases 1-3's bytes added to each transfer, their compute as extra
        seconds at each device's CPU clock."""
        co = self.cohort(n)
        return dataclasses.replace(
            ctx,
            bytes_down=ctx.bytes_down + co.bytes_down,
            bytes_up=ctx.bytes_up + co.bytes_up,
            extra_s=co.client_s,
        )

    def round_cost(self, n: int, plan: RoundPlan, fleet: Fleet) -> RoundCost:
        """Phase 4 of a round of ``n`` chosen devices, or its failure.

        Args:
            n: the cohort.
            plan: the clock's plan of the round (its survivors: the plans
                whose updates the server would aggregate).
            fleet: the devices (the survivors' links, for the exchange).
        """
        co, c = self.cohort(n), self.costs
        alive = [p.client for p in plan.arrived]
        s, r = len(alive), n - len(alive)
        if s < co.threshold:
            why = f"{s} survivors of {n}, below the threshold {co.threshold}"
            return self._with_columns(co, RoundCost(True, why, s, r, 0, 0, 0.0, 0.0))
        k = co.neighbours
        # a dropped client's neighbours (all others for secagg: exactly r)
        dropped_nb = math.ceil(r * k / (n - 1)) if n > 1 else 0
        up = k * (c.id_bytes + c.seed_share_bytes) + dropped_nb * (
            c.key_share_bytes - c.seed_share_bytes
        )
        down = k * c.id_bytes
        d_s, u_s = fleet.comm_time(np.asarray(alive, dtype=np.int64), down, up)
        unmask_s = float((d_s + u_s).max()) if s else 0.0
        # each dropped client's pairwise masks with its surviving neighbours
        pairs = r * (k * s / (n - 1)) if n > 1 else 0.0
        cycles = (
            n * co.share_threshold**2 * c.shamir_cycles  # rebuild n secrets
            + pairs * (c.key_agreement_cycles + self._mask_cycles(n))
            + s * self._mask_cycles(n)  # every survivor's self mask
        )
        flops = cycles * c.flops_per_cycle
        return self._with_columns(
            co, RoundCost(False, "", s, r, up, down, unmask_s, flops)
        )

    def _with_columns(self, co: Cohort, cost: RoundCost) -> RoundCost:
        """``cost`` with its round's rounds.parquet columns."""
        return dataclasses.replace(
            cost,
            columns={
                "secagg_failed": cost.failed,
                "secagg_reason": cost.reason,
                "secagg_threshold": co.threshold,
                "secagg_survivors": cost.survivors,
                "secagg_dropped": cost.dropped,
                "secagg_bytes_up": co.bytes_up + cost.unmask_bytes_up,
                "secagg_bytes_down": co.bytes_down + cost.unmask_bytes_down,
                "secagg_client_s": co.client_s,
                "secagg_unmask_s": cost.unmask_s,
                "secagg_server_s": cost.server_flops / self.server_rate,
            },
        )


def aborted(plan: RoundPlan) -> RoundPlan:
    """A failed round's plan: its survivors' updates are lost too (their
    masked inputs reached the server, which could not unmask the sum), as
    ``aborted`` drops that keep their steps and arrival times."""
    plans = tuple(
        dataclasses.replace(p, dropped=True, reason=ABORTED) if p.contributes else p
        for p in plan.plans
    )
    return dataclasses.replace(plan, plans=plans)


def secagg_model(
    spec: SecAggSpec | None,
    bytes_up: int,
    elem_bytes: int,
    server_rate: float,
) -> SecAggModel | None:
    """The run's model, or None without a ``secure_aggregation`` section.

    Args:
        spec: the section.
        bytes_up: the algorithm's plain upload (its elements are masked).
        elem_bytes: bytes of one element.
        server_rate: the server's FLOP/s (inf: a free server).
    """
    if spec is None:
        return None
    m = bytes_up // elem_bytes
    return SecAggModel(spec, m, elem_bytes, server_rate)


def secagg_summary(rows: Sequence[Row]) -> dict[str, float] | None:
    """summary.json's ``fleet_realised.secure_aggregation``: the rounds that
    failed (count and share) and the unmasking's total seconds, exchange
    and server; None without the section (no ``secagg_failed`` column).

    Example:
        >>> cols = ("secagg_failed", "secagg_unmask_s", "secagg_server_s")
        >>> rows = [dict(zip(cols, (True, 0.0, 0.0), strict=True)),
        ...         dict(zip(cols, (False, 0.5, 2.0), strict=True))]
        >>> secagg_summary(rows)
        {'rounds_failed': 1.0, 'failed_share': 0.5, 'unmask_s': 0.5, 'server_s': 2.0}
    """
    if not rows or "secagg_failed" not in rows[-1]:
        return None
    failed = sum(bool(r["secagg_failed"]) for r in rows)
    return {
        "rounds_failed": float(failed),
        "failed_share": failed / len(rows),
        "unmask_s": sum(number(r["secagg_unmask_s"], "secagg_unmask_s") for r in rows),
        "server_s": sum(number(r["secagg_server_s"], "secagg_server_s") for r in rows),
    }


__all__ = [
    "ABORTED",
    "Cohort",
    "RoundCost",
    "SecAggCosts",
    "SecAggModel",
    "SecAggSpec",
    "aborted",
    "secagg_model",
    "secagg_summary",
]
