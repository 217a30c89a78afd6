"""The server's validation split, and which data server-side choices use.

Why and how (docs/datasets.md): FedPNS's CHECK LOSS scores candidate models
on rows taken from the clients, not on the reported test set. An algorithm
that scores models at the server says so with ``validation_use(q)``:
``"validation"``, ``"test"`` (an optimistic opt-in) or None.

Example:
    >>> from fedsim.data.base import FederatedData
    >>> d = FederatedData(
    ...     x=np.arange(10.0).reshape(10, 1), y=np.zeros(10, np.int64),
    ...     offsets=np.array([0, 4, 10]), weights=np.array([4.0, 6.0]),
    ...     test_x=np.zeros((2, 1)), test_y=np.zeros(2, np.int64), num_classes=2)
    >>> v = split_validation(d, 0.25, seed=0)   # floor(1) + floor(1.5) rows
    >>> v.n_samples.tolist(), v.weights.tolist(), len(v.val_y)
    ([3, 5], [3.0, 5.0], 2)
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from fedsim.data.base import FederatedData
from fedsim.data.errors import DataError

if TYPE_CHECKING:
    from fedsim.data.base import DatasetSpec
    from fedsim.spec import DataInfo


class _Named(Protocol):
    """An algorithm as these checks see it (it may also define
    ``validation_use(clients_per_round)``)."""

    @property
    def name(self) -> str:
        """The scenario's ``algorithm.name``."""


# separates the split's random stream from every other use of the seed
_TAG = 0x7A11D


class RowSplit(NamedTuple):
    """Rows taken from each client (:func:`take_rows`): the taken and kept
    row indices (ascending), the kept rows' client offsets, and the client
    weights (sample-count weights follow the new counts; others stay)."""

    taken: np.ndarray
    kept: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray

    def kept_data(self, data: FederatedData) -> FederatedData:
        """``data`` with only the kept rows for the clients to train on (its
        rows, offsets and weights as the split leaves them)."""
        return replace(
            data,
            x=np.ascontiguousarray(data.x[self.kept]),
            y=np.ascontiguousarray(data.y[self.kept]),
            offsets=self.offsets,
            weights=self.weights,
        )

    def taken_xy(self, data: FederatedData) -> tuple[np.ndarray, np.ndarray]:
        """The taken rows' inputs and labels, in row order."""
        return (
            np.ascontiguousarray(data.x[self.taken]),
            np.ascontiguousarray(data.y[self.taken]),
        )


def take_rows(
    data: FederatedData, fraction: float, seed: int, tag: int, refusal: str
) -> RowSplit:
    """Choose ``floor(fraction n_i)`` random rows of each client i (at most
    n_i - 1, so every client keeps one), from the stream ``(seed, tag)``.

    The server's validation split and the clients' own held-out split both
    take rows this way, each with its own ``tag``, so neither moves the
    other's draws nor training's.

    Raises:
        DataError: no row is taken; the message is ``refusal`` (which names
            the field and its value), the largest client's count, and what
            to do.
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), tag]))
    counts = data.n_samples
    taken = np.zeros(int(data.offsets[-1]), dtype=bool)
    for start, n in zip(data.offsets[:-1].tolist(), counts.tolist(), strict=True):
        # floor(f n), nudged so that e.g. 0.29 * 100 = 28.999... counts 29
        k = max(0, min(int(np.floor(fraction * n + 1e-9)), n - 1))
        taken[start + rng.permutation(n)[:k]] = True
    taken_rows, kept_rows = np.flatnonzero(taken), np.flatnonzero(~taken)
    # a client's rows now start after the kept rows before its old start
    offsets = np.searchsorted(kept_rows, data.offsets).astype(np.int64)
    weights = data.weights
    if np.array_equal(weights, counts.astype(weights.dtype)):
        weights = np.diff(offsets).astype(np.float64)
    if len(taken_rows) == 0:
        raise DataError(
            f"{refusal} (the largest holds {int(counts.max(initial=0))}); raise it"
        )
    return RowSplit(taken_rows, kept_rows, offsets, weights)


def split_validation(data: FederatedData, fraction: float, seed: int) -> FederatedData:
    """Move ``floor(fraction n_i)`` random rows of each client i (at most
    n_i - 1), in order, to the server's validation set; weights that were the
    sample counts follow the new counts. :class:`DataError` if no row moves."""
    refusal = f"data.validation_fraction {fraction} takes no row from any client"
    split = take_rows(data, fraction, seed, _TAG, refusal)
    val_x, val_y = split.taken_xy(data)
    return replace(split.kept_data(data), val_x=val_x, val_y=val_y)


def validation_use(algorithm: _Named, clients_per_round: int) -> str | None:
    """Which data an algorithm scores models on at the server.

    Args:
        algorithm: the scenario's algorithm (its optional
            ``validation_use(q)`` answers).
        clients_per_round: the selector's round size q.

    Returns:
        ``"validation"``, ``"test"`` (opt-in) or None (none).
    """
    use = getattr(algorithm, "validation_use", None)
    return None if use is None else use(clients_per_round)


def validation_problem(
    algorithm: _Named, data: DatasetSpec, clients_per_round: int
) -> str | None:
    """Why a scenario cannot run as written (None: it can): its algorithm
    scores models on a validation split that its data does not reserve.

    Args:
        algorithm: the scenario's algorithm.
        data: the scenario's ``data`` section.
        clients_per_round: the selector's round size.
    """
    fraction = float(getattr(data, "validation_fraction", 0.0))
    if validation_use(algorithm, clients_per_round) != "validation" or fraction > 0:
        return None
    return (
        f"algorithm {algorithm.name!r} scores models on the server's "
        "validation data (CHECK LOSS), but data.validation_fraction is 0: set "
        "data.validation_fraction (e.g. 0.05: rows taken from the clients' "
        "training data), or set algorithm.check_loss_data: test to score on "
        "the test set (optimistic: the reported test metrics then saw the "
        "choice)"
    )


def describe_validation(use: str | None, data: FederatedData | None) -> str | None:
    """summary.json's ``server_validation``: the data the server's model
    choices used, or None when no server-side choice looks at data.

    Args:
        use: :func:`validation_use` of the run.
        data: the run's data (its validation rows are counted).
    """
    if use == "test":
        return "test set (opt-in)"
    if use == "validation":
        val_y = None if data is None else data.val_y
        rows = "?" if val_y is None else str(len(val_y))
        return f"validation split ({rows} rows)"
    return None


def check_stated(spec: DatasetSpec, data: FederatedData, num_clients: int) -> None:
    """Refuse a plug-in dataset whose ``build()`` disagrees with what its
    ``info()`` stated: the checks before the run counted the model's
    parameters and the memory from the statement, and a model built for 4
    features and 3 classes fails deep in the loss (an IndexError) on 7 and
    10. Also refuse labels outside ``num_classes`` (the same IndexError).

    Built-in datasets are held to their statements by their own tests; the
    check is for plug-ins, whose statements nothing else compares.

    Args:
        spec: the ``data`` section.
        data: what ``spec.build`` returned.
        num_clients: the fleet's size (as ``info`` was asked).

    Raises:
        DataError: one line naming the plug-in, the hook and both values.
    """
    # the built-in datasets live in fedsim.data (its registry imports this
    # module, so asking the registry would be an import cycle)
    if type(spec).__module__.startswith("fedsim.data."):
        return
    name = getattr(spec, "dataset", type(spec).__qualname__)
    stated = spec.info(num_clients)
    problem = _statement_problem(stated, data) or _labels_problem(data)
    if problem is not None:
        raise DataError(f"data.dataset {name!r}: {problem}")


def _statement_problem(stated: DataInfo | None, data: FederatedData) -> str | None:
    """How ``data`` differs from the shape and class count ``info()`` stated
    (None: as stated, or nothing stated)."""
    if stated is None:
        return None
    shape = tuple(int(n) for n in data.x.shape[1:])
    if stated.shape is not None and stated.shape != shape:
        return (
            f"info() stated samples of shape {stated.shape}, but build() "
            f"returned x of shape {tuple(data.x.shape)} (samples {shape}); "
            "info() must describe what build() returns"
        )
    if stated.classes is not None and stated.classes != data.num_classes:
        return (
            f"info() stated {stated.classes} classes, but build() "
            f"returned num_classes={data.num_classes}; info() must describe "
            "what build() returns"
        )
    return None


def _labels_problem(data: FederatedData) -> str | None:
    """Integer labels outside 0 .. num_classes - 1 in the training or test
    rows (None: all inside, or no classes)."""
    labels = [y for y in (data.y, data.test_y) if y.size and y.dtype.kind in "iu"]
    top = max((int(y.max()) for y in labels), default=-1)
    low = min((int(y.min()) for y in labels), default=0)
    if data.num_classes > 0 and (top >= data.num_classes or low < 0):
        return (
            f"build() returned labels from {low} to {top}, expected 0 "
            f"to {data.num_classes - 1} (num_classes={data.num_classes})"
        )
    return None


def build_data(spec: DatasetSpec, num_clients: int, seed: int) -> FederatedData:
    """The dataset of a scenario's ``data`` section, with its validation split
    (:func:`split_validation`) when it asks for one. The clients' own
    held-out rows (``client_test_fraction``) are not taken here: they come
    after the fleet-data links (:func:`fedsim.data.heldout.with_heldout`)."""
    data = spec.build(num_clients, seed)
    check_stated(spec, data, num_clients)
    fraction = float(getattr(spec, "validation_fraction", 0.0))
    return split_validation(data, fraction, seed) if fraction > 0 else data
