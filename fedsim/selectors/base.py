"""What every client selector shares: the context it reads and the interface.

A selector is a frozen dataclass of hyperparameters (the scenario's
``selector`` section); its *state* is a plain JSON value (checkpoints hold
it) that goes in and comes out. The round loop that calls it, and async
mode: docs/architecture.md. Contract (``tests/test_selectors.py``):
``select`` returns distinct, sorted ``int64`` ids, at most
``clients_per_round``, all among ``draw.candidates``, drawn only from
``draw.rng``; the state survives ``pickle`` and a JSON round trip.
``observe`` reads ``result.clients`` (per client: ``train_loss``,
``weight``, ``flags``) and ``result.info.flags`` (the algorithm's flags).

Example (a toy selector: the ``clients_per_round`` lowest online ids, and
how many rounds it has chosen):
    >>> from typing import Literal
    >>> @dataclass(frozen=True)
    ... class Lowest(Selector):
    ...     name: Literal["lowest"] = "lowest"
    ...     def init(self, ctx):
    ...         return {"rounds": 0}
    ...     def select(self, state, draw):
    ...         ids = np.unique(draw.candidates[: self.k(draw)])
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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from fedsim.clock import expected_steps
from fedsim.spec import PLUGIN_CONFIG, PosInt, Problem

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from fedsim.algorithms.base import AggregateInfo, Flag
    from fedsim.clock import JobWork, RoundSpec
    from fedsim.facts import RunFacts
    from fedsim.fleet import Fleet

# Client ids (int64) and per-client figures (float64), by client id.
Ints = NDArray[np.int64]
Floats = NDArray[np.float64]

# A selector's state: a JSON value each selector shapes itself (checkpoints
# keep it), read by its own methods only: typed loosely here.
SelectorState = dict[str, Any]  # type: ignore[explicit-any]


class ClientOutcome(Protocol):
    """One aggregated client's outcome as :meth:`Selector.observe` reads it
    (``fedsim.server.ClientStats``)."""

    @property
    def update_norm(self) -> float: ...
    @property
    def train_loss(self) -> float: ...
    @property
    def weight(self) -> float: ...  # effective aggregation weight w_i
    @property
    def flags(self) -> dict[str, Flag]: ...  # the algorithm's per-client columns


class RoundResult(Protocol):
    """A synchronous round's outcome as :meth:`Selector.observe` reads it
    (``fedsim.server.RoundResult``; a protocol, so selectors sit below the
    server): what aggregation did, and each aggregated client's outcome."""

    @property
    def info(self) -> AggregateInfo: ...
    @property
    def clients(self) -> Mapping[int, ClientOutcome]: ...


@dataclass(frozen=True, eq=False)
class SelectorContext:
    """Facts about the run that never change, built once (:meth:`from_run`).

    Read-only arrays by client id: ``data_weights`` p_i (sum 1), ``n_samples``
    n_i, ``speed`` (local steps per simulated second) and ``round_time_s``
    (expected seconds of one round: download + steps / speed + upload).
    ``informed`` is False for made-up :meth:`uniform` contexts.
    """

    num_clients: int
    data_weights: Floats
    n_samples: Ints
    speed: Floats
    round_time_s: Floats
    informed: bool = True

    def __post_init__(self) -> None:
        m = int(self.num_clients)
        for name in ("data_weights", "n_samples", "speed", "round_time_s"):
            dtype = np.int64 if name == "n_samples" else np.float64
            a = np.asarray(getattr(self, name), dtype=dtype)
            if a.flags.writeable:  # a read-only array (the fleet's) is shared
                a = a.copy()
                a.setflags(write=False)
            if a.shape != (m,):
                raise ValueError(f"{name} has shape {a.shape}, expected ({m},)")
            object.__setattr__(self, name, a)
        if m and (self.data_weights.sum() <= 0 or np.any(self.data_weights < 0)):
            raise ValueError("data_weights must be non-negative with a positive sum")

    @classmethod
    def uniform(cls, num_clients: int) -> SelectorContext:
        """Equal data weights and unit speeds (``informed=False``)."""
        return replace(cls.from_arrays(np.ones(int(num_clients))), informed=False)

    @classmethod
    def from_arrays(
        cls,
        n_samples: ArrayLike,
        speed: ArrayLike | None = None,
        round_time_s: ArrayLike | None = None,
    ) -> SelectorContext:
        """A context from sample counts (speeds and round times default to 1).

        >>> SelectorContext.from_arrays([1, 3]).data_weights.tolist()
        [0.25, 0.75]
        """
        n = np.asarray(n_samples, dtype=np.int64)
        ones = np.ones(n.size)
        s, r = (ones if a is None else np.asarray(a) for a in (speed, round_time_s))
        return cls(n.size, n / n.sum(), n, s, r)

    @classmethod
    def from_run(
        cls,
        fleet: Fleet,
        n_samples: Ints,
        round_spec: RoundSpec,
        batch_size: int,
        bytes_down: int,
        bytes_up: int,
        work: JobWork | None = None,
    ) -> SelectorContext:
        """The context of a run; ``work`` (FedDM: a job that is not local SGD
        steps) replaces the steps and ``bytes_up`` with its own."""
        n = np.asarray(n_samples, dtype=np.int64)
        m = fleet.size
        if n.shape != (m,):
            raise ValueError(f"n_samples has shape {n.shape}, expected ({m},)")
        steps = expected_steps(round_spec, n, batch_size)
        down, up = fleet.comm_time(np.arange(m), bytes_down, bytes_up)
        if work is not None:
            steps = work.steps * work.unit_cost
            up = 8.0 * work.bytes_up / fleet.up_bps + fleet.latency_s
        return cls(
            num_clients=m,
            data_weights=n / n.sum() if n.sum() > 0 else np.full(m, 1.0 / max(m, 1)),
            n_samples=n,
            speed=fleet.speed,
            round_time_s=down + steps / fleet.speed + up,
        )


@dataclass(frozen=True, eq=False)
class Draw:
    """What one call of :meth:`Selector.select` chooses from: the round (async:
    the server version the jobs will download), the int64 ids of the online
    (async: and idle) devices, the generator of every random choice, and the
    run's :class:`SelectorContext`."""

    round: int
    candidates: Ints
    rng: np.random.Generator
    ctx: SelectorContext

    def __post_init__(self) -> None:
        cand = np.asarray(self.candidates, dtype=np.int64)
        object.__setattr__(self, "candidates", cand)


@dataclass(frozen=True)
class Selector:
    """Base class: subclasses declare ``name: Literal["<name>"]`` and their
    hyperparameters as fields, and override :meth:`select` (and :meth:`init`
    / :meth:`observe` when they keep state). The class variables say how it
    samples, for :func:`fedsim.algorithms.sampling.pairing`."""

    __pydantic_config__: ClassVar = PLUGIN_CONFIG

    name: str = "base"
    clients_per_round: PosInt = 10

    # the unbiased scheme of docs/algorithms.md section 3 it matches, or None
    sampling_scheme: ClassVar[str | None] = None
    # refuses an uninformed context (needs real data weights or speeds)
    needs_context: ClassVar[bool] = False
    # can choose idle devices in async mode from what ``observe`` learned of
    # applied updates, never from a synchronous round's full result
    asynchronous: ClassVar[bool] = False
    # what init returns (a copy), when it depends on nothing else
    initial_state: ClassVar[SelectorState] = {}
    # ``uniform`` (q/m each), ``proportional`` (to p_i) or ``adaptive``
    inclusion: ClassVar[str] = "adaptive"
    # draws with replacement and reports multiplicities
    with_replacement: ClassVar[bool] = False
    # draws already favour p_i, so n_i weights would count the data share twice
    data_share_in_sample: ClassVar[bool] = False
    # ``algorithm.sampling`` when the scenario names none; None: the algorithm's
    default_weighting: ClassVar[str | None] = None
    # returns min(clients_per_round, #online) ids (False: a random count,
    # at most clients_per_round, as the Bernoulli selector)
    fixed_count: ClassVar[bool] = True

    @property
    def adaptive(self) -> bool:
        """Whether the choice may depend on training results (the class
        overrides :meth:`observe`); async mode then holds the timeline back."""
        return type(self).observe is not Selector.observe

    def check(self, facts: RunFacts) -> list[Problem]:
        """What is wrong with this selector in the run (asked when the
        scenario loads, as ``Algorithm.check``). The base refuses
        ``round.policy: async`` unless ``asynchronous``.

        Args:
            facts: the run as plug-ins see it.

        Returns:
            Problems: errors refuse the file, warnings are printed.
        """
        if facts.round.policy != "async" or self.asynchronous:
            return []
        from fedsim.plugins import builtins  # (imports every built-in)

        usable = [
            n
            for n, c in builtins("selector").items()
            if getattr(c, "asynchronous", False)
        ]
        return [
            Problem(
                f"selector.name {self.name!r} chooses clients from a synchronous "
                "round's full result, which round.policy 'async' does not have "
                "(updates arrive one by one); with round.policy 'async' use "
                f"selector.name {', '.join(usable)}"
            )
        ]

    def with_slots(self, k: int) -> Selector:
        """This selector choosing ``k`` ids per call (async: the free slots;
        a round with ``over_select``: the devices asked for).

        Args:
            k: the ids one :meth:`select` call returns at most.

        Returns:
            A copy with ``clients_per_round = k``; a selector whose choice
            depends on a ratio to ``clients_per_round`` (power-of-choice's
            d) overrides this to keep the ratio.
        """
        return replace(self, clients_per_round=k)

    def init(self, ctx: SelectorContext) -> SelectorState:
        """The state before the first round.

        Args:
            ctx: the run's :class:`SelectorContext` (data weights, speeds,
                expected round times), built once.

        Returns:
            A plain JSON value (checkpoints keep it): by default a copy of
            ``initial_state``.

        Raises:
            TypeError: ``needs_context`` and ``ctx`` is a made-up
                :meth:`SelectorContext.uniform` one.
        """
        if self.needs_context and not ctx.informed:
            raise TypeError(
                f"selector {self.name!r} needs the run's real data weights and "
                "device speeds (SelectorContext.from_run), not "
                "SelectorContext.uniform"
            )
        return copy.deepcopy(self.initial_state)

    def select(self, state: SelectorState, draw: Draw) -> tuple[Ints, SelectorState]:
        """Choose who trains: the hook every selector writes.

        Args:
            state: the selector's state (do not change it in place).
            draw: the round (async: the version the chosen download), the
                candidates (online, and in async mode idle) as int64 ids,
                the generator and the run's context.

        Returns:
            (ids, new state): distinct, sorted ``int64`` ids among
            ``draw.candidates``, at most ``clients_per_round`` (exactly
            ``min(clients_per_round, #candidates)`` when ``fixed_count``),
            every random choice drawn from ``draw.rng`` only, so the same
            draw gives the same ids (a resume replays them).
        """
        raise NotImplementedError

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        """Learn from round (async: version) ``t``'s outcome.

        Overriding it makes the selector :attr:`adaptive`: in asynchronous
        mode the timeline then waits for each version's updates before the
        next choice, so a choice sees exactly the versions made before it.

        Args:
            state: the state before ``t``.
            t: the round or version just applied.
            result: what the server did (``result.info``: the algorithm's
                flags and signal) and each aggregated client's outcome
                (``result.clients``: update norm, training loss, weight).
            ctx: the run's context.

        Returns:
            The new state (a JSON value); by default ``state`` unchanged.
        """
        return state

    def multiplicity(self, state: SelectorState, ids: Ints) -> dict[int, int] | None:
        """How often each of the last selected ``ids`` was drawn (sampling
        with replacement: the server passes it to the algorithm as each
        update's ``multiplicity`` extra).

        Args:
            state: the state :meth:`select` returned with ``ids``.
            ids: the ids it returned.

        Returns:
            {id: times drawn}, or None: each drawn once.
        """
        return None

    def expected_draws(self, ctx: SelectorContext) -> Floats | None:
        """E[k_i] per client when every device is a candidate (the inclusion
        probability without replacement), for the participation-bias meter.

        Args:
            ctx: the run's context.

        Returns:
            float64 ``[m]``, or None where it depends on the run
            (``adaptive`` selectors).
        """
        return None

    def artifact(self, state: SelectorState, round_: int) -> list[dict[str, object]]:
        """What the selector shows of itself after a round (FedPNS: P_i).

        Args:
            state: its state after ``round_``.
            round_: the round just observed.

        Returns:
            Rows of ``selector.parquet`` (the runtime adds ``round``); []
            for nothing.
        """
        return []

    def metrics(self, state: SelectorState, round_: int) -> dict[str, float]:
        """The selector's own scalars after a round (or version), each
        written as the rounds.parquet column ``sel_<name>`` (e.g. an
        exploration rate, or how many clients it holds in a bandit arm).

        Called once per round or version, after :meth:`observe`, with the
        state the next selection will use; only when a class overrides it.

        Args:
            state: its state after ``round_``.
            round_: the round (or version) just made.

        Returns:
            ``{name: real number}``, names of letters, digits and ``_``; a
            pure function of the state, so the column is the same with any
            number of workers and after a resume. The base returns {}.
        """
        return {}

    def k(self, draw: Draw) -> int:
        """How many ids a fixed-count :meth:`select` returns.

        Args:
            draw: the call's draw.

        Returns:
            ``clients_per_round``, or fewer when fewer devices are candidates.
        """
        return min(self.clients_per_round, len(draw.candidates))


def weighted_pick(ids: Ints, weights: Floats, n: int, rng: np.random.Generator) -> Ints:
    """``n`` distinct ids drawn without replacement in proportion to
    ``weights`` (>= 0); ids of weight 0 only fill places the others cannot.

    >>> weighted_pick(np.array([4, 5, 6]), np.array([0.0, 1.0, 0.0]), 1,
    ...               np.random.default_rng(0)).tolist()
    [5]
    """
    n = min(n, ids.size)
    pos = weights > 0
    if np.count_nonzero(pos) <= n:
        fill = rng.choice(ids[~pos], size=n - np.count_nonzero(pos), replace=False)
        return np.concatenate([ids[pos], fill]).astype(np.int64)
    w = weights[pos]
    return rng.choice(ids[pos], size=n, replace=False, p=w / w.sum())


def last_losses(result: RoundResult) -> list[tuple[int, float]]:
    """(client id, mean training loss) of the round's aggregated clients, by
    id, without non-finite losses (a diverged client teaches nothing)."""
    pairs = ((int(c), float(st.train_loss)) for c, st in result.clients.items())
    return sorted((c, loss) for c, loss in pairs if math.isfinite(loss))
