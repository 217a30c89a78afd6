"""The contract every algorithm and selector keeps, as functions a plug-in's
own tests call (fedsim's tests run them over every built-in).

Each check raises ``AssertionError`` naming the broken promise; nothing here
starts Ray or reads a file. In a plug-in's test suite:

    >>> from fedsim.algorithms import FedAvg
    >>> from fedsim.selectors import Uniform
    >>> check_algorithm(FedAvg(), identical=lambda alg, x0, delta, n: x0 + delta)
    >>> check_selector(Uniform(clients_per_round=3))

What :func:`check_algorithm` checks: the object, its server state and its
client updates pickle (Ray ships all three); ``n`` identical updates give
``identical(alg, x0, delta, n)`` with chi^2(p||w) = 0; over rounds of varied
updates the state keeps its keys, shapes and dtypes and stays finite; no
update leaves the state unchanged; only ``stateful`` algorithms return client
state; one payload vector per ``down_factor``. Updates come from the
algorithm's own client hooks (``start_client`` / ``client_finish``). The
hooks (docs/extending.md, "Hooks"): every step passes the server's own
check of what ``aggregate`` returns (the state's keys, shapes and dtypes,
an ``AggregateInfo``, named real-number ``metrics``), also in rounds whose
``RoundContext.failures`` lists lost clients; ``instruct`` (when
overridden) gives only the round's clients entries of tensors or numbers,
never the shared payload's names, the same for the same state, and the
client hooks run with them in the payload; ``aggregate_evaluation``
(federated evaluation's rule) gives named real numbers, the same for the
same client results.

What :func:`check_selector` checks: ids are distinct, sorted ``int64``, at
most ``clients_per_round`` and all among the candidates (none only when no
device is online); every random choice comes from the generator given (the
same generator gives the same ids, no global generator moves); the state
pickles, survives a JSON round trip (checkpoints keep it) and a resumed run
picks the same ids; multiplicities, artifact rows and ``metrics`` (named
real numbers) are well formed.
"""

from __future__ import annotations

import json
import math
import pickle
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from fedsim import hooks
from fedsim.algorithms.base import (
    AggregateInfo,
    Algorithm,
    ClientEvaluation,
    ClientInfo,
    ClientUpdate,
    Failure,
    Flag,
    RoundContext,
    ServerState,
    outdated_form,
)
from fedsim.lazy import torch
from fedsim.selectors.base import Draw, Selector, SelectorContext, SelectorState
from fedsim.solvers import SolverState

__all__ = ["Expected", "check_algorithm", "check_selector", "make_update"]

_T = TypeVar("_T")
_Layout = tuple["torch.Size", "torch.dtype"]  # a state tensor's shape and dtype

M = 5  # clients in the checked federation
LR = 0.1

# (alg, x0, delta, n) -> the model n identical updates ``delta`` from x0 give;
# alg is the algorithm checked, of its own class (a test reads its fields)
Expected = Callable[[Any, "torch.Tensor", "torch.Tensor", int], "torch.Tensor"]


def make_update(
    alg: Algorithm,
    state: ServerState,
    client: int,
    delta: torch.Tensor,
    tau: int = 4,
    weight: float = 1.0,
    relative_weight: float = 1.0,
    client_state: dict[str, torch.Tensor] | None = None,
) -> ClientUpdate:
    """What a client that moved by ``delta`` in ``tau`` SGD steps uploads.

    The update is made by the algorithm's own client hooks
    (``start_client``, then ``client_finish``), not assembled by hand, so the
    extras and the new client state are the ones a real round would carry:
    a contract check on a hand-made update would test the check, not the
    algorithm.

    Args:
        alg: the algorithm whose hooks make the update.
        state: the server state the client started from (its payload is
            what the client "downloaded").
        client: the client id (0 <= client < 5, the checked federation).
        delta: the local model change x_end - x_start.
        tau: the local steps taken; ||a||_1 is taken as ``tau`` (plain SGD).
        weight: the client's aggregation weight before normalisation.
        relative_weight: the client's n_i / mean n, as the runtime passes it.
        client_state: the client's persistent state from earlier rounds
            (None: a client seen for the first time).

    Returns:
        The :class:`ClientUpdate` the server's ``aggregate`` receives.
    """
    payload = alg.payload(state)
    if alg.instructs:  # the client's own entries, as a worker merges them
        own = _instructions(alg, state, [client], 0)
        payload = {**payload, **own.get(client, {})}
    info = ClientInfo(
        client, n_samples=10, num_clients=M, relative_weight=relative_weight
    )
    ctx = alg.start_client(info, payload, client_state or {})
    st = SolverState(x0=payload["x"], lr=LR, steps=tau, norm_a=float(tau))
    extras, new_state = alg.client_finish(delta, st, ctx)
    return ClientUpdate(client, delta, weight, tau, float(tau), 0.5, extras, new_state)


def _x0() -> torch.Tensor:
    """The starting model: 7 distinct values of both signs, so a rule that
    scales, clips or drops coordinates shows in the result."""
    return torch.linspace(-1.0, 1.0, 7)


def _delta() -> torch.Tensor:
    """A client's update: mixed signs, a zero and magnitudes from 1/8 to 2, so
    sign- or norm-dependent steps (adaptive servers) differ from plain ones."""
    return torch.tensor([0.5, -0.25, 0.0, 1.0, -1.0, 0.125, 2.0])


def check_algorithm(
    alg: Algorithm | type[Algorithm],
    identical: Expected | None = None,
    uploads_delta: bool = True,
) -> None:
    """Run the algorithm contract on ``alg`` (a class: its default instance).

    Args:
        alg: the algorithm, with the hyperparameters to check.
        identical: the model that ``n`` identical updates give (e.g.
            ``x0 + delta`` for FedAvg); None skips that check.
        uploads_delta: False for an algorithm whose clients upload something
            else than a model delta (a synthetic set): only the checks that
            need no client update run.

    Raises:
        AssertionError: naming the promise ``alg`` breaks.
    """
    obj = alg() if isinstance(alg, type) else alg
    _check_object(obj)
    _check_empty_round(obj)
    _check_evaluation(obj)
    if not uploads_delta:
        return
    _check_pickles(obj)
    if identical is not None:
        for n in (1, 3, M):
            _check_identical(obj, identical, n)
    _check_rounds(obj)
    u = make_update(obj, obj.init(_x0(), M), 0, _delta())
    assert (u.new_state is not None) == obj.stateful, (
        "client_finish returns new state if and only if the algorithm is stateful"
    )


def _shipped(obj: _T) -> _T:
    """``obj`` after the pickle round trip Ray puts it through between
    processes.

    Safe by construction: the only bytes unpickled are those ``pickle.dumps``
    made from ``obj`` on the line before, in this process; no file, socket or
    user-supplied bytes are ever read here.
    """
    again: _T = pickle.loads(pickle.dumps(obj))
    return again


def _check_object(alg: Algorithm) -> None:
    """It is written in the current form of the interface, pickles (Ray ships
    it) and its communication factors fit its payload."""
    outdated = outdated_form(type(alg))
    assert outdated is None, outdated
    again = _shipped(alg)
    assert again == alg and hash(again) == hash(alg), "the algorithm must pickle"
    assert alg.down_factor >= 1 and alg.up_factor >= 1, "factors are >= 1"
    n_payload = len(alg.payload(alg.init(_x0(), M)))
    assert alg.down_factor == n_payload, (
        f"down_factor {alg.down_factor} but the payload has {n_payload} vectors"
    )


def _check_empty_round(alg: Algorithm) -> None:
    """A round in which no update arrives (every client dropped) changes
    nothing: the runtime calls ``aggregate`` with an empty list then, and a
    rule that divided by the number of updates would produce NaNs."""
    state = alg.init(_x0(), M)
    new, info = _step(alg, state, [])
    assert new.keys() == state.keys(), "an empty round keeps the state's keys"
    assert all(torch.equal(new[k], state[k]) for k in state), (
        "an empty round leaves the state unchanged"
    )
    assert info.weights == {}, "an empty round reports no weights"


def _evaluations() -> list[list[ClientEvaluation]]:
    """Federated evaluation's inputs the contract tries: one client; four
    of unequal sizes, losses and accuracies (ids ascending, as the runtime
    gives them); and clients whose accuracy is NaN (targets without
    classes)."""
    nan = math.nan
    return [
        [ClientEvaluation(3, 5, 0.7, 0.6)],
        [
            ClientEvaluation(0, 2, 1.5, 0.5),
            ClientEvaluation(1, 8, 0.25, 1.0),
            ClientEvaluation(2, 1, 3.0, 0.0),
            ClientEvaluation(4, 5, 0.8, 0.4),
        ],
        [ClientEvaluation(0, 4, 0.5, nan), ClientEvaluation(2, 6, 1.0, nan)],
    ]


def _check_evaluation(alg: Algorithm) -> None:
    """``aggregate_evaluation`` (federated evaluation's rule) returns what
    the runtime checks, named real numbers (:func:`fedsim.hooks.check_metrics`,
    the same message), and the same scalars for the same results (a
    resume and any number of workers agree)."""
    plugin, hook = f"algorithm {alg.name!r}", "aggregate_evaluation"
    for t, results in enumerate(_evaluations()):
        try:
            first = hooks.check_metrics(
                plugin, hook, alg.aggregate_evaluation(results, t)
            )
            again = hooks.check_metrics(
                plugin, hook, alg.aggregate_evaluation(list(results), t)
            )
        except hooks.PluginFailure as exc:
            raise AssertionError(str(exc)) from None
        assert _same_scalars(first, again), (
            "aggregate_evaluation gives the same scalars for the same results"
        )


def _same_scalars(a: dict[str, float], b: dict[str, float]) -> bool:
    """The same names and values (NaN equal to NaN: a rule may report an
    undefined figure, and must report it again)."""
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a
    )


def _check_pickles(alg: Algorithm) -> None:
    """The server state before and after a round, and a client update, survive
    pickling unchanged: Ray ships all three between processes."""
    state = alg.init(_x0(), M)
    u = make_update(alg, state, 0, _delta())
    state2, _ = _step(alg, state, [u])
    for obj in (state, state2):
        again = _shipped(obj)
        assert again.keys() == obj.keys(), "the server state must pickle"
        assert all(torch.equal(again[k], obj[k]) for k in obj)
    back = _shipped(u)
    assert torch.equal(back.delta, u.delta), "a client update must pickle"
    assert back.extras.keys() == u.extras.keys()


def _check_identical(alg: Algorithm, identical: Expected, n: int) -> None:
    """``n`` clients send the same delta with equal weights and steps: the new
    model is ``identical(...)``, the meter sees no objective inconsistency and
    gives every update a weight, the weights summing to 1."""
    x0, delta = _x0(), _delta()
    state = alg.init(x0, M)
    ups = [make_update(alg, state, i, delta.clone()) for i in range(n)]
    new, info = _step(alg, state, ups)
    expected = identical(alg, x0, delta, n)
    torch.testing.assert_close(new["x"], expected, rtol=1e-6, atol=1e-6)
    # identical updates with equal weights and steps: no objective inconsistency
    assert abs(info.chi2_pw) <= 1e-12, f"chi2(p||w) = {info.chi2_pw}, expected 0"
    assert math.isclose(sum(info.weights.values()), 1.0), "weights sum to 1"
    assert sorted(info.weights) == list(range(n)), "one weight per update"


def _check_rounds(alg: Algorithm) -> None:
    """Three rounds of varied updates (weights, steps, client state): the
    state keeps its layout and stays finite, and so does every client's."""
    x0 = _x0()
    state = alg.init(x0, M)
    spec = {k: (v.shape, v.dtype) for k, v in state.items()}
    assert state["x"].dtype == x0.dtype and state["x"].shape == x0.shape
    gen = torch.Generator().manual_seed(0)
    kept: dict[int, dict[str, torch.Tensor]] = {}
    for t, chosen in enumerate(((0, 1, 2), (1, 3), (0, 4))):
        ups = [_varied_update(alg, state, i, gen, kept) for i in chosen]
        # the round's other clients were selected and lost (RoundContext.failures)
        lost = tuple(Failure(c, "late") for c in range(M) if c not in chosen)
        state, info = _step(alg, state, ups, t, lost)
        _check_round_result(state, info, spec)
        assert set(info.weights) <= set(chosen), "weights only for the round's clients"
    for cs in kept.values():
        assert all(v.shape == x0.shape for v in cs.values()), "client state shape"
        _check_finite(cs.values(), "a client's state")


def _step(
    alg: Algorithm,
    state: ServerState,
    ups: list[ClientUpdate],
    t: int = 0,
    failures: tuple[Failure, ...] = (),
) -> tuple[ServerState, AggregateInfo]:
    """Round ``t``'s step as the server takes it: ``aggregate`` through
    ``server_step``, the updates in ascending
    client id (the ordering contract), no server context, and the result
    checked as the server checks it (:func:`fedsim.hooks.check_step`)."""
    ordered = sorted(ups, key=lambda u: u.client)
    ctx = RoundContext(round=t, failures=failures)
    got = alg.server_step(state, ordered, ctx)
    try:
        return hooks.check_step(f"algorithm {alg.name!r}", "aggregate", got, state)
    except hooks.PluginFailure as exc:
        raise AssertionError(str(exc)) from None


def _instructions(
    alg: Algorithm, state: ServerState, clients: list[int], t: int
) -> dict[int, dict[str, torch.Tensor]]:
    """``alg.instruct`` as the server calls and checks it
    (:func:`fedsim.server.check_instructions`), and its promises: the same
    entries for the same state (a resume and any number of workers agree)."""
    from fedsim.server import check_instructions

    shared = set(alg.payload(state))
    plugin = f"algorithm {alg.name!r}"
    try:
        first = check_instructions(
            plugin, alg.instruct(state, clients, t), clients, shared
        )
        again = check_instructions(
            plugin, alg.instruct(state, clients, t), clients, shared
        )
    except hooks.PluginFailure as exc:
        raise AssertionError(str(exc)) from None
    assert first.keys() == again.keys() and all(
        first[c].keys() == again[c].keys()
        and all(torch.equal(first[c][k], again[c][k]) for k in first[c])
        for c in first
    ), "instruct gives the same entries for the same state, clients and round"
    return first


def _check_round_result(
    state: ServerState,
    info: AggregateInfo,
    spec: dict[str, _Layout],
) -> None:
    """The new state has the layout ``spec`` (key: (shape, dtype)), all finite;
    the meter's figures are finite and its weights positive."""
    got = {k: (v.shape, v.dtype) for k, v in state.items()}
    assert got == spec, "the state keeps its keys, shapes and dtypes"
    _check_finite(state.values(), "the server state")
    assert math.isfinite(info.chi2_pw) and math.isfinite(info.tau_eff)
    assert all(w > 0 for w in info.weights.values()), "weights are positive"


def _varied_update(
    alg: Algorithm,
    state: ServerState,
    i: int,
    gen: torch.Generator,
    kept: dict[int, dict[str, torch.Tensor]],
) -> ClientUpdate:
    """Client i's update, with steps, weight and relative weight growing with i;
    its new persistent state (if any) goes into ``kept``."""
    delta = torch.randn(state["x"].shape, generator=gen)
    u = make_update(alg, state, i, delta, 2 + i, 1.0 + i, 0.5 + i / 4, kept.get(i))
    if u.new_state is not None:
        kept[i] = u.new_state
    return u


def _check_finite(tensors: Iterable[torch.Tensor], what: str) -> None:
    """Every tensor of ``tensors`` is finite (``what`` names them)."""
    assert all(bool(torch.isfinite(v).all()) for v in tensors), f"{what} is not finite"


# ------------------------------------------------------------------ selectors
@dataclass
class _Stats:
    """One client's line of a fake round result (what ``observe`` reads)."""

    train_loss: float
    weight: float = 0.1
    flags: dict[str, Flag] = field(default_factory=dict)
    update_norm: float = 1.0  # ||Delta_i||


@dataclass
class _Result:
    """A synchronous round's outcome as ``Selector.observe`` reads it (the
    ``RoundResult`` protocol), without the server's metrics."""

    info: AggregateInfo
    clients: dict[int, _Stats]


_CTX = SelectorContext.from_arrays(
    n_samples=[5, 1, 8, 2, 9, 3, 7, 4],
    speed=[1.0, 2.0, 0.5, 4.0, 1.0, 3.0, 0.25, 1.5],
    round_time_s=[10.0, 5.0, 20.0, 2.5, 10.0, 3.3, 40.0, 6.7],
)


def fake_result(ids: np.ndarray, rng: np.random.Generator) -> _Result:
    """A round outcome for ``observe``: a loss per client and a flag each (as
    an algorithm's per-client columns), no algorithm ``signal``.

    Args:
        ids: the clients that trained this round.
        rng: the generator of the fake losses and flags (one per round, so
            a resumed drive sees the same outcomes as an uninterrupted one).

    Returns:
        An object that satisfies the ``RoundResult`` protocol selectors read.
    """
    flags: dict[int, dict[str, Flag]] = {}
    clients = {}
    for i in ids.tolist():
        flags[i] = {"flagged": bool(rng.random() < 0.3)}
        loss = float(rng.uniform(0.1, 3.0))
        # the norm follows the loss: no further draw, so the flags stay as before
        clients[i] = _Stats(loss, flags=flags[i], update_norm=loss / 2)
    weights = {i: 1 / len(ids) for i in ids.tolist()}
    return _Result(AggregateInfo(weights, 1.0, 0.0, flags), clients)


def candidates(t: int) -> np.ndarray:
    """Online devices in round t of 8: varied subsets, some fewer than 3, in
    round 5 none.

    The subsets are a pure function of ``t`` (their own seeded generator),
    so two drives of one selector see the same availability; the small and
    empty rounds exercise what a selector does with fewer candidates than
    ``clients_per_round`` (take them all) and with none (select nothing).

    Args:
        t: the round.

    Returns:
        The sorted ``int64`` ids online in round ``t``.
    """
    if t == 5:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(1000 + t)
    size = [8, 5, 2, 7, 1, 0, 6, 8, 4, 3][t % 10] or 8
    return np.sort(rng.choice(8, size=size, replace=False)).astype(np.int64)


def drive(
    sel: Selector,
    rounds: int = 12,
    seed: int = 0,
    state: SelectorState | None = None,
    start: int = 0,
) -> tuple[list[np.ndarray], SelectorState]:
    """Select and observe for ``rounds`` rounds of :func:`candidates`, every
    choice from generators seeded by (``seed``, round).

    This is the runtime's loop in miniature: the selector's randomness comes
    only from the generator of each round's :class:`Draw`, and its state
    goes in and comes out, so driving rounds 0..11 in one call or as 0..5
    then 6..11 (passing the state on) must give the same ids; the resume
    check relies on that.

    Args:
        sel: the selector under test.
        rounds: how many rounds to drive.
        seed: the run seed of the per-round generators.
        state: the selector state to continue from (None: ``sel.init``).
        start: the first round (non-zero when continuing a drive).

    Returns:
        The ids selected in each round, and the selector state after the
        last one.
    """
    state = sel.init(_CTX) if state is None else state
    history = []
    for t in range(start, start + rounds):
        d = Draw(t, candidates(t), np.random.default_rng([seed, t]), _CTX)
        ids, state = sel.select(state, d)
        history.append(ids)
        result = fake_result(ids, np.random.default_rng([7, t]))
        state = sel.observe(state, t, result, _CTX)
    return history, state


def check_selector(sel: Selector, deterministic: bool = False) -> None:
    """Run the selector contract on ``sel`` over 8 devices.

    Args:
        sel: the selector, with a ``clients_per_round`` of at most 8.
        deterministic: True for a selector that draws nothing at random with
            these hyperparameters; otherwise another generator must change
            its choice in some round of twelve.

    Raises:
        AssertionError: naming the promise ``sel`` breaks.
    """
    again = _shipped(sel)
    assert again == sel and hash(again) == hash(sel), "the selector must pickle"
    history, _ = drive(sel, rounds=30)
    for t, ids in enumerate(history):
        _check_ids(sel, ids, candidates(t))
    _check_deterministic(sel, deterministic)
    _, state = drive(sel, rounds=6)
    restored = json.loads(json.dumps(state))
    assert restored == state, "the state must survive a JSON round trip"
    assert _shipped(state) == state, "the state must pickle"
    a, _ = drive(sel, rounds=4, state=state, start=6)
    b, _ = drive(sel, rounds=4, state=restored, start=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), (
        "a run resumed from the JSON copy of the state picks the same ids"
    )
    _check_extras(sel)


def _check_ids(sel: Selector, ids: np.ndarray, cand: np.ndarray) -> None:
    """One choice among ``cand`` keeps the selection promises (module
    docstring); a selector drawing with replacement may return fewer ids."""
    k = sel.clients_per_round
    assert ids.dtype == np.int64 and ids.ndim == 1, "ids are a 1-d int64 array"
    assert np.all(np.diff(ids) > 0), "ids are distinct and sorted"
    assert len(ids) <= k, f"at most clients_per_round ({k}) ids"
    assert set(ids.tolist()) <= set(cand.tolist()), "ids are among the candidates"
    assert (len(ids) > 0) == (len(cand) > 0), "none only when no device is online"
    if _exact_count(sel):
        assert len(ids) == min(k, len(cand)), "k ids when k devices are online"


def _exact_count(sel: Selector) -> bool:
    """Whether ``sel`` returns exactly min(k, #online) ids: not when it draws
    with replacement (fewer distinct) or a random count (``fixed_count``)."""
    fixed = getattr(type(sel), "fixed_count", True)
    return sel.sampling_scheme != "proportional" and fixed


def _check_deterministic(sel: Selector, deterministic: bool) -> None:
    """The same generator gives the same choices, another generator others
    (unless ``deterministic``), and no global generator moves meanwhile."""
    np_state = np.random.get_state(legacy=False)["state"]  # MT19937: key, pos
    py_state = random.getstate()
    torch_state = torch.random.get_rng_state()
    _check_generator_use(sel, deterministic)
    after = np.random.get_state(legacy=False)["state"]
    same = np_state["pos"] == after["pos"]
    assert np.array_equal(np_state["key"], after["key"]) and same, (
        "numpy's global generator must not move"
    )
    assert random.getstate() == py_state, "random's global generator must not move"
    assert torch.equal(torch.random.get_rng_state(), torch_state)


def _check_generator_use(sel: Selector, deterministic: bool) -> None:
    """Twelve rounds twice from one seed are equal, ids and state; from another
    seed some round differs, unless the selector is ``deterministic``."""
    a, state_a = drive(sel, seed=3)
    b, state_b = drive(sel, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert state_a == state_b, "the same generator gives the same state"
    c, _ = drive(sel, seed=4)
    differs = any(not np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    assert differs != deterministic, (
        "a deterministic selector ignores the generator"
        if deterministic
        else "another generator gives other ids at some round"
    )


def _check_extras(sel: Selector) -> None:
    """Multiplicities and artifact rows are well formed."""
    state = sel.init(_CTX)
    ids, state = sel.select(
        state, Draw(0, np.arange(8), np.random.default_rng(0), _CTX)
    )
    k = sel.multiplicity(state, ids)
    if k is not None:
        assert sorted(k) == ids.tolist() and all(v >= 1 for v in k.values())
        assert sum(k.values()) == sel.clients_per_round
    state = sel.observe(state, 0, fake_result(ids, np.random.default_rng(0)), _CTX)
    rows = sel.artifact(state, 0)
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
    json.dumps(rows)
    try:  # the runtime's check of the metrics hook (rounds.parquet columns)
        hooks.check_metrics(f"selector {sel.name!r}", "metrics", sel.metrics(state, 0))
    except hooks.PluginFailure as exc:
        raise AssertionError(str(exc)) from None
