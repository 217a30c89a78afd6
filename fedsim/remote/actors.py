"""The life of fedsim's Ray actors, in three named parts: what makes two runs'
actors interchangeable (:class:`ActorShape`), where idle actors wait between
runs (:class:`WarmPool`, with :func:`warm_workers` as its block), and when a
failed call is sent again (:class:`RetryPolicy`). The executors
(:mod:`fedsim.executors`) and the server actor (:mod:`fedsim.remote.server_actor`)
use them; docs/architecture.md, "Runtime on Ray", tells the whole story.

Starting an actor costs a process, Ray's worker set-up and torch's import:
about 3 s of CPU, more than a small run's training. Inside a warm pool's
block, a run that ends parks its actors in the pool instead of killing them,
and the next run of the process that asks for the same shape sets them up
for itself. Parked actors hold their CPUs and GPUs: every path that needs
Ray resources for something else releases them first (:func:`release_parked`).

Example (the policy's back-off, no Ray needed):
    >>> policy = RetryPolicy()
    >>> [policy.after(Attempts(n, deaths=n, waited_s=0.0)) for n in (1, 3, 8)]
    [1.0, 4.0, None]
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from fedsim.spec import ResourceSpec

# A Ray actor handle. Ray types an actor's methods dynamically (its stubs
# give attribute access the type Never), so handles are typed loosely here,
# under this one name.
Handle = Any  # type: ignore[explicit-any]


@dataclass(frozen=True)
class ActorShape:
    """What makes a parked actor fit a new run: the same kind, Ray session
    and resources (a new session parks into new shapes).

    Attributes:
        kind: ``worker`` or ``server``.
        job: the Ray job the actor belongs to.
        cpus: CPUs it holds.
        gpus: GPUs it holds.
        resources: custom node resources it holds, sorted by name.
    """

    kind: Literal["worker", "server"]
    job: str
    cpus: float
    gpus: float
    resources: tuple[tuple[str, float], ...] = ()

    @property
    def holds(self) -> bool:
        """Whether parked actors of this shape keep resources from others."""
        return bool(self.cpus or self.gpus or self.resources)

    @classmethod
    def of_workers(cls, res: ResourceSpec) -> ActorShape | None:
        """The shape of a run's worker actors, or None when they never park
        (a placement group or per-node data ties them to their run).

        Args:
            res: the run's ``resources`` section.
        """
        if res.placement != "spread" or res.data == "per_node":
            return None
        cpus, gpus = float(res.cpus_per_worker), float(res.gpus_per_worker)
        return cls("worker", _job(), cpus, gpus)

    @classmethod
    def of_server(cls, res: ResourceSpec) -> ActorShape | None:
        """The shape of a run's server actor, or None when it never parks (it
        lives in the driver, or in a placement group's bundle).

        Args:
            res: the run's ``resources`` section.
        """
        spec = res.server
        if spec.home != "actor" or cls.of_workers(res) is None:
            return None
        extra = tuple(sorted((k, float(v)) for k, v in spec.resources.items()))
        return cls("server", _job(), float(spec.cpus), float(spec.gpus), extra)


def _job() -> str:
    """This process's Ray job."""
    import ray

    return str(ray.get_runtime_context().get_job_id())


class WarmPool:
    """Idle Ray actors of this process, by shape, between runs.

    Life cycle: made by :func:`warm_workers` (or ``with WarmPool():``),
    current for the block (:func:`current_pool`), closed at its end, which
    kills every actor still parked. Nothing of it is process-wide: a run
    outside any block kills its actors when it ends.

    Guarantees: an actor taken from the pool is set up from scratch for
    its new run (``setup_for``) and keeps nothing of its last one, so the
    results are those of new actors. The creation data of each actor it
    has held is kept until the actor is killed: Ray restarts a dead actor
    with the arguments it was *created* with, an earlier run's, which must
    still be in the object store.
    """

    def __init__(self) -> None:
        self._idle: dict[ActorShape, list[Handle]] = {}
        self._pins: dict[object, object] = {}  # actor id -> its creation data
        self.closed = False

    def __enter__(self) -> WarmPool:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)
        self.close()

    def idle(self) -> int:
        """How many actors wait in the pool."""
        return sum(len(a) for a in self._idle.values())

    def park(self, shape: ActorShape, actors: Sequence[Handle], pin: object) -> None:
        """Keep ``actors`` for a later run (each first drops its run's state:
        its ``park()``; Ray runs that call before any later one).

        Args:
            shape: their shape.
            actors: the actors.
            pin: their creation data (kept for an actor seen the first time).
        """
        for a in actors:
            a.park.remote()
            self._pins.setdefault(a._actor_id, pin)
        self._idle.setdefault(shape, []).extend(actors)

    def adopt(
        self, shape: ActorShape | None, n: int, setup: tuple[object, ...]
    ) -> list[Handle]:
        """Up to ``n`` parked actors of ``shape``, set up for a new run by
        their ``setup_for(*setup)`` method; one that fails its set-up (it
        died while parked) is killed and left out, so a new actor takes its
        place. Parked actors of ``shape`` beyond ``n`` are killed (their
        resources may be what the run's other actors need).

        Args:
            shape: the key (None: nothing is taken).
            n: the most actors taken.
            setup: the arguments of the actors' ``setup_for``.

        Returns:
            The actors taken, set up.
        """
        import ray

        mine = self._idle.pop(shape, []) if shape is not None else []
        for a in mine[n:]:
            self._kill(a)
        ready: list[Handle] = []
        for a, ref in [(a, a.setup_for.remote(*setup)) for a in mine[:n]]:
            try:
                ray.get(ref, timeout=60)
                ready.append(a)
            except Exception:  # dead or stuck: a new actor takes its place
                self._kill(a)
        return ready

    def release(
        self, keep: Collection[ActorShape | None] = (), everything: bool = True
    ) -> None:
        """Kill parked actors, so their resources go to other work.

        Args:
            keep: shapes whose actors stay parked.
            everything: also those that hold no resources (a server actor
                with ``cpus: 0``, which is in nobody's way); False for a run
                that only needs the resources.
        """
        gone = [s for s in self._idle if s not in keep and (everything or s.holds)]
        for shape in gone:
            for a in self._idle.pop(shape):
                self._kill(a)

    def close(self) -> None:
        """Kill every parked actor; the pool takes no more (idempotent)."""
        self.release()
        self.closed = True

    def _kill(self, actor: Handle) -> None:
        """Kill ``actor`` (gone already: nothing to do) and drop its pin."""
        self._pins.pop(actor._actor_id, None)
        kill(actor)


_CURRENT: ContextVar[WarmPool | None] = ContextVar("fedsim_warm_pool", default=None)


def current_pool() -> WarmPool | None:
    """The pool of the innermost :func:`warm_workers` block, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def warm_workers() -> Iterator[WarmPool]:
    """Within this block, Ray actors outlive their run: the next run in this
    process with the same shape (the Ray session; CPUs and GPUs per worker;
    the server actor's resources; ``placement: spread`` and data shipped by
    the driver) sets them up for itself instead of starting new ones. For
    many small runs in one process (a notebook's sweep, the test suite).
    The results are those of new actors. On leaving the block, the parked
    actors are killed; a block inside another uses the outer one's pool.

    Yields:
        The block's :class:`WarmPool`.
    """
    outer = current_pool()
    if outer is not None:
        yield outer
        return
    with WarmPool() as pool:
        yield pool


def release_parked(
    keep: Collection[ActorShape | None] = (), everything: bool = True
) -> None:
    """:meth:`WarmPool.release` on the current pool (nothing outside a
    :func:`warm_workers` block, where no actor is ever parked)."""
    pool = current_pool()
    if pool is not None:
        pool.release(keep, everything)


def kill(actor: Handle) -> None:
    """Kill ``actor`` (gone already, e.g. with its session: nothing to do)."""
    import ray

    with contextlib.suppress(Exception):
        ray.kill(actor)


@dataclass(frozen=True)
class Attempts:
    """One actor call's failures so far, as :meth:`RetryPolicy.after` reads them.

    Attributes:
        failures: the call's failures, the latest included.
        deaths: how many of them were not an actor Ray was restarting.
        waited_s: seconds since the call first failed.
        restarting: the latest failure is an actor Ray is restarting
            (``ActorUnavailableError``) or has restarted (``StaleWorkerError``).
    """

    failures: int
    deaths: int
    waited_s: float
    restarting: bool = False


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed actor call is sent again, and after how long.

    Actors restart without limit but Ray retries no task: the executor
    resends a call itself, so it can count the retried tasks and note lost
    nodes. The cases:

    ===============================  ==========================================
    the latest failure               the call is sent again
    ===============================  ==========================================
    the actor is restarting          while less than ``restart_wait_s`` has
    (``ActorUnavailableError``), or  passed since the call first failed (the
    came back restarted, serving no  new process imports torch: on a loaded
    run (``StaleWorkerError``: the   machine that once took over 45 s)
    executor sets it up first)
    the actor died                   while fewer than ``max_deaths`` of the
    (``RayActorError``)              call's failures were such (a node's loss
                                     can fail a call more than once; restarts
                                     in between do not use them up)
    anything else                    never: the error ends the run (the
                                     executor does not ask)
    ===============================  ==========================================

    Each resend waits the back-off of the call's n-th failure: 1, 2, 4, 8,
    then 10 s (``min(0.5 * 2^min(n, 5), 10)``): a restart takes seconds,
    the loss of a node longer.
    """

    max_deaths: int = 8
    restart_wait_s: float = 600.0

    def backoff(self, failures: int) -> float:
        """Seconds to wait before the resend after the ``failures``-th failure."""
        return min(0.5 * 2 ** min(failures, 5), 10.0)

    def after(self, attempts: Attempts) -> float | None:
        """The wait before resending a call that failed as ``attempts`` says,
        or None: give up, and let the failure end the run."""
        delay = self.backoff(attempts.failures)
        if attempts.restarting:
            return delay if attempts.waited_s < self.restart_wait_s else None
        return delay if attempts.deaths < self.max_deaths else None


@dataclass
class CallFailures:
    """The failures of each call of one executor batch (the executor's
    running count for :class:`RetryPolicy`)."""

    first: dict[int, float] = field(default_factory=dict)  # call -> monotonic s
    failures: dict[int, int] = field(default_factory=dict)
    deaths: dict[int, int] = field(default_factory=dict)

    def record(self, k: int, restarting: bool, now: float) -> Attempts:
        """Note call ``k``'s failure at ``now`` (monotonic seconds); its
        :class:`Attempts` so far."""
        since = self.first.setdefault(k, now)
        self.failures[k] = self.failures.get(k, 0) + 1
        self.deaths[k] = self.deaths.get(k, 0) + (0 if restarting else 1)
        return Attempts(self.failures[k], self.deaths[k], now - since, restarting)
