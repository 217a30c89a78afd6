"""What every client selector shares: the context it reads and the interface.

A selector is a frozen dataclass of hyperparameters (its fields are the
scenario's ``selector`` section, validated by pydantic when the scenario is
loaded). Its *state* is a plain JSON value (a dict of numbers, strings and
lists), because the server writes it into every checkpoint's ``meta.json``;
state goes in and comes out, the object never changes.

The round loop calls, with ``ctx`` the run's :class:`SelectorContext`::

    state = selector.init(ctx)
    for t in rounds:
        ids, state = selector.select(state, Draw(t, online_ids, rng_t, ctx))
        k = selector.multiplicity(state, ids)        # None, or {id: times drawn}
        result = train_and_aggregate(ids)            # a server.RoundResult
        state = selector.observe(state, t, result, ctx)
        rows = selector.artifact(state, t)           # -> selector.parquet

Contract (``tests/test_selectors.py`` checks it for every registered selector):
``select`` returns distinct, sorted ``int64`` ids, at most
``clients_per_round`` of them, all among ``draw.candidates`` (the devices
online now); every random choice comes from ``draw.rng``, so the ids are a
pure function of (state, draw); the state survives ``pickle`` and a JSON
round trip.

``observe`` reads a round's :class:`fedsim.server.RoundResult`:
``result.clients`` maps each aggregated client id to its stats
(``train_loss``, ``weight``, ``flags``) and ``result.info.flags`` holds the
algorithm's per-client flags (FedPNS's ``labeled``/``removed``).

Asynchronous mode (``round.policy: async``, selectors with
``asynchronous = True``): each ``select`` picks which idle online devices
take free training slots (``draw.round`` is the server version the jobs
will download, ``draw.rng`` is seeded by the choice's index), and
``observe(state, w, result, ctx)`` runs when server version ``w`` is
applied, with ``result.clients`` the applied arrivals (a device that arrived
twice: its later update). A selector is :attr:`Selector.adaptive` when it
overrides ``observe``; the runtime then makes every choice after version
``w`` was applied see exactly the observations of versions ``<= w``, however
jobs are batched or resumed (the timeline is not run ahead of the server).

Example (a toy selector: the ``clients_per_round`` lowest online ids, and
how many rounds it has chosen):
    >>> from typing import Literal
    >>> @dataclass(frozen=True)
    ... class Lowest(Selector):
    ...     name: Literal["lowest"] = "lowest"
    ...     def init(self, ctx):
    ...         return {"rounds": 0}
    ...     def select(self, state, draw):
    ...         ids = sorted_ids(draw.candidates[: self.k(draw)])
    ...         return ids, {"rounds": state["rounds"] + 1}
    >>> ctx = SelectorContext.uniform(4)
    >>> sel = Lowest(clients_per_round=2)
    >>> ids, state = sel.select(sel.init(ctx),
    ...                         Draw(0, [1, 2, 3], np.random.default_rng(0), ctx))
    >>> ids.tolist(), state
    ([1, 2], {'rounds': 1})
    >>> ctx.num_clients, ctx.data_weights.tolist()
    (4, [0.25, 0.25, 0.25, 0.25])
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedsim.clock import expected_steps
from fedsim.spec import PLUGIN_CONFIG, PosInt

if TYPE_CHECKING:
    from fedsim.clock import JobWork
    from fedsim.fleet import Fleet
    from fedsim.server import RoundResult

__all__ = [
    "Draw",
    "Selector",
    "SelectorContext",
    "SelectorState",
    "last_losses",
    "sorted_ids",
    "weighted_pick",
]

SelectorState = dict[str, Any]


@dataclass(frozen=True, eq=False)
class SelectorContext:
    """Facts about the run that never change, for selectors to read.

    Built once per run by the server (:meth:`from_run`); arrays are indexed by
    client id and read-only.

    Attributes:
        num_clients: m.
        data_weights: float64 [m], p_i = n_i / n (sums to 1).
        n_samples: int64 [m], n_i.
        speed: float64 [m], the device's local steps per simulated second
            (before straggler slowdowns).
        round_time_s: float64 [m], expected simulated seconds of one round of
            the device: download + ``expected_steps / speed`` + upload, with
            ``expected_steps`` the round policy's work (E n_i / B under
            ``fixed_epochs``, ``max_steps`` otherwise). Oort's system utility.
        informed: False for :meth:`uniform` contexts (equal weights and
            speeds, made up when the server gives only ``m``); selectors that
            need real weights or speeds refuse them.
    """

    num_clients: int
    data_weights: np.ndarray
    n_samples: np.ndarray
    speed: np.ndarray
    round_time_s: np.ndarray
    informed: bool = True

    def __post_init__(self) -> None:
        m = int(self.num_clients)
        for name, dtype in (
            ("data_weights", np.float64),
            ("n_samples", np.int64),
            ("speed", np.float64),
            ("round_time_s", np.float64),
        ):
            a = np.asarray(getattr(self, name), dtype=dtype)
            if a.flags.writeable:  # a read-only array (the fleet's) is shared
                a = a.copy()
                a.setflags(write=False)
            if a.shape != (m,):
                raise ValueError(f"{name} has shape {a.shape}, expected ({m},)")
            object.__setattr__(self, name, a)
        total = float(self.data_weights.sum())
        if m and (total <= 0 or np.any(self.data_weights < 0)):
            raise ValueError("data_weights must be non-negative with a positive sum")

    @classmethod
    def uniform(cls, num_clients: int) -> SelectorContext:
        """Equal data weights and unit speeds (``informed=False``)."""
        m = int(num_clients)
        return cls(
            num_clients=m,
            data_weights=np.full(m, 1.0 / m) if m else np.zeros(0),
            n_samples=np.ones(m, dtype=np.int64),
            speed=np.ones(m),
            round_time_s=np.ones(m),
            informed=False,
        )

    @classmethod
    def from_arrays(
        cls,
        n_samples: Any,
        speed: Any = None,
        round_time_s: Any = None,
    ) -> SelectorContext:
        """A context from per-client sample counts (and optionally speeds and
        round times, default 1), for tests and notebooks.

        >>> SelectorContext.from_arrays([1, 3]).data_weights.tolist()
        [0.25, 0.75]
        """
        n = np.asarray(n_samples, dtype=np.int64)
        m = n.size
        return cls(
            num_clients=m,
            data_weights=n / n.sum(),
            n_samples=n,
            speed=np.ones(m) if speed is None else speed,
            round_time_s=np.ones(m) if round_time_s is None else round_time_s,
        )

    @classmethod
    def from_run(
        cls,
        fleet: Fleet,
        n_samples: np.ndarray,
        round_spec: Any,
        batch_size: int,
        bytes_down: int,
        bytes_up: int,
        work: JobWork | None = None,
    ) -> SelectorContext:
        """The context of a run: data sizes, device speeds and round times.

        Args:
            fleet: the run's devices.
            n_samples: n_i per client.
            round_spec: the scenario's ``round`` section (a ``RoundSpec``).
            batch_size: B of local steps.
            bytes_down, bytes_up: what one device downloads and uploads per
                round (the clock's sizes).
            work: a job that is not local SGD steps (FedDM): its units, their
                cost in local steps and each device's upload replace the
                steps and ``bytes_up`` above.
        """
        n = np.asarray(n_samples, dtype=np.int64)
        m = fleet.size
        if n.shape != (m,):
            raise ValueError(f"n_samples has shape {n.shape}, expected ({m},)")
        steps = expected_steps(round_spec, n, batch_size)
        down, up = fleet.comm_time(np.arange(m), bytes_down, bytes_up)
        if work is not None:  # FedDM: its iterations, its synthetic set
            steps = work.steps * work.unit_cost
            up = 8.0 * work.bytes_up / fleet.up_bps + fleet.latency_s
        total = float(n.sum())
        return cls(
            num_clients=m,
            data_weights=n / total if total > 0 else np.full(m, 1.0 / max(m, 1)),
            n_samples=n,
            speed=fleet.speed,
            round_time_s=down + steps / fleet.speed + up,
        )


@dataclass(frozen=True, eq=False)
class Draw:
    """What one call of :meth:`Selector.select` chooses from.

    Attributes:
        round: the round (synchronous) or the server version the chosen
            jobs will download (asynchronous: several choices may share it).
        candidates: int64, the ids of the devices that may be chosen (online
            and, asynchronously, idle).
        rng: the generator every random choice comes from.
        ctx: the run's :class:`SelectorContext`.
    """

    round: int
    candidates: np.ndarray
    rng: np.random.Generator
    ctx: SelectorContext

    def __post_init__(self) -> None:
        cand = np.asarray(self.candidates, dtype=np.int64)
        object.__setattr__(self, "candidates", cand)


@dataclass(frozen=True)
class Selector:
    """Base class. Subclasses declare ``name: Literal["<name>"]`` and their
    hyperparameters as fields, and override :meth:`select` (and
    :meth:`init` / :meth:`observe` when they keep state).

    ``sampling_scheme`` names the unbiased aggregation scheme of ALGORITHMS.md
    section 3 that matches how the selector samples (``uniform``: scheme (ii),
    ``proportional``: scheme (i)); None when none does. A scenario whose
    algorithm declares ``sampling: uniform`` or ``proportional`` needs a
    selector with that scheme.
    """

    __pydantic_config__: ClassVar = PLUGIN_CONFIG

    name: str = "base"
    clients_per_round: PosInt = 10

    sampling_scheme: ClassVar[str | None] = None
    # True when the selector needs real data weights or speeds (it refuses
    # an uninformed context).
    needs_context: ClassVar[bool] = False
    # True when the selector can pick which idle device starts the next job
    # in asynchronous mode: it chooses from the context, the candidates, the
    # generator and what ``observe`` learned from applied updates, never from
    # a synchronous round's full result (FedPNS's algorithm flags).
    asynchronous: ClassVar[bool] = False
    # What init returns (a copy), when it depends on nothing else.
    initial_state: ClassVar[SelectorState] = {}
    # How the selector samples, for the sampling/weighting pairing check
    # (fedsim.algorithms.sampling.pairing): ``uniform`` (each of m clients
    # with probability q/m), ``proportional`` (in proportion to p_i) or
    # ``adaptive`` (probabilities that follow training: no closed form).
    inclusion: ClassVar[str] = "adaptive"
    # True when the selector draws with replacement and reports multiplicities.
    with_replacement: ClassVar[bool] = False
    # True when its draws already favour clients in proportion to p_i, so
    # that n_i weights on top would count the data share twice.
    data_share_in_sample: ClassVar[bool] = False
    # The ``algorithm.sampling`` a scenario gets when it names none (FedAvg,
    # FedNova and their descendants); None: the algorithm's own default.
    default_weighting: ClassVar[str | None] = None

    @property
    def adaptive(self) -> bool:
        """Whether the choice may depend on training results: the class
        overrides :meth:`observe`. In asynchronous mode the runtime then
        holds the timeline back so that no choice runs ahead of the server.

        >>> Selector().adaptive
        False
        """
        return type(self).observe is not Selector.observe

    def with_slots(self, k: int) -> Selector:
        """This selector choosing ``k`` ids per call (asynchronous mode: the
        free training slots of one choice)."""
        return replace(self, clients_per_round=k)

    def init(self, ctx: SelectorContext) -> SelectorState:
        """The initial state (a plain JSON value): ``initial_state``."""
        self.check_context(ctx)
        return copy.deepcopy(self.initial_state)

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        """Choose among ``draw.candidates``: (sorted distinct ids, new state)."""
        raise NotImplementedError

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        """Update the state from round ``t``'s outcome (default: nothing to
        learn)."""
        return state

    def multiplicity(
        self, state: SelectorState, ids: np.ndarray
    ) -> dict[int, int] | None:
        """How many times each of the last selected ``ids`` was drawn (selectors
        sampling with replacement); None: once each."""
        return None

    def expected_draws(self, ctx: SelectorContext) -> np.ndarray | None:
        """E[k_i], how many times each client is drawn in a round when every
        device is a candidate (the inclusion probability for selectors
        drawing without replacement); None for ``adaptive`` selectors."""
        return None

    def artifact(self, state: SelectorState, round_: int) -> list[dict[str, Any]]:
        """Rows for ``selector.parquet`` after round ``round_`` (the server adds
        the ``round`` column); [] when the selector has nothing to plot."""
        return []

    # ------------------------------------------------------------- helpers
    def check_context(self, ctx: SelectorContext) -> None:
        """Refuse an uninformed context when the selector needs real data
        weights or device speeds (``needs_context``)."""
        if self.needs_context and not ctx.informed:
            raise TypeError(
                f"selector {self.name!r} needs the run's real data weights and "
                "device speeds (SelectorContext.from_run), not "
                "SelectorContext.uniform"
            )

    def k(self, draw: Draw) -> int:
        """How many ids this draw can give: ``clients_per_round``, or fewer
        when fewer devices are candidates."""
        return min(self.clients_per_round, len(draw.candidates))


def sorted_ids(ids: np.ndarray | list[int]) -> np.ndarray:
    """Distinct ids, sorted, as int64."""
    return np.unique(np.asarray(ids, dtype=np.int64))


def weighted_pick(
    ids: np.ndarray, weights: np.ndarray, n: int, rng: np.random.Generator
) -> np.ndarray:
    """``n`` distinct ids drawn without replacement with probabilities
    proportional to ``weights`` (>= 0); ids of weight 0 only fill the places
    the positive ones cannot.

    >>> weighted_pick(np.array([4, 5, 6]), np.array([0.0, 1.0, 0.0]), 1,
    ...               np.random.default_rng(0)).tolist()
    [5]
    """
    ids = np.asarray(ids, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    n = min(int(n), ids.size)
    pos = w > 0
    if np.count_nonzero(pos) <= n:
        fill = rng.choice(ids[~pos], size=n - np.count_nonzero(pos), replace=False)
        return np.concatenate([ids[pos], fill]).astype(np.int64)
    return rng.choice(ids[pos], size=n, replace=False, p=w[pos] / w[pos].sum())


def last_losses(result: RoundResult) -> list[tuple[int, float]]:
    """(client id, mean training loss) of the round's aggregated clients, by
    id, leaving out non-finite losses (a diverged client teaches nothing)."""
    pairs = ((int(c), float(st.train_loss)) for c, st in result.clients.items())
    return sorted((c, loss) for c, loss in pairs if math.isfinite(loss))
