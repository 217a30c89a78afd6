"""Each client's own held-out rows, for federated evaluation (the
``eval.federated_every`` rounds: docs/extending.md, "Federated evaluation").

``data.client_test_fraction`` f moves ``floor(f n_i)`` random rows of each
client i (at most n_i - 1) out of its training rows into its own held-out
split; ``eval.federated_every`` K then has the clients evaluate the global
model on those rows every K rounds (docs/scenarios.md, "eval";
docs/extending.md, "Federated evaluation"). The rows are chosen from
``(seed, tag)`` with a tag of their own, so the split never shares a random
stream with the data's generation, the server's validation split or
training; weights that were the sample counts follow the new counts, as
:func:`fedsim.data.validation.split_validation` does.

The split is taken last, after the fleet-data links moved the partitions
over the devices, so a device's held-out rows come from the data it trains
on.

Example:
    >>> from fedsim.data.base import FederatedData
    >>> d = FederatedData(
    ...     x=np.arange(10.0).reshape(10, 1), y=np.zeros(10, np.int64),
    ...     offsets=np.array([0, 4, 10]), weights=np.array([4.0, 6.0]),
    ...     test_x=np.zeros((2, 1)), test_y=np.zeros(2, np.int64), num_classes=2)
    >>> h = split_heldout(d, 0.25, seed=0)   # floor(1) + floor(1.5) rows
    >>> h.n_samples.tolist(), h.weights.tolist(), h.heldout_offsets.tolist()
    ([3, 5], [3.0, 5.0], [0, 1, 2])
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fedsim.data.base import FederatedData
from fedsim.data.validation import take_rows

if TYPE_CHECKING:
    from fedsim.data.base import DatasetSpec
    from fedsim.spec import EvalSpec

# separates the held-out split's random stream from every other use of the seed
_TAG = 0xFED5E7


def split_heldout(data: FederatedData, fraction: float, seed: int) -> FederatedData:
    """``data`` with ``floor(fraction n_i)`` random rows of each client i (at
    most n_i - 1) moved to the client's own held-out split.

    Args:
        data: the clients' rows (after the validation split and the links).
        fraction: ``data.client_test_fraction``, in (0, 0.5].
        seed: the run's seed (the rows come from ``(seed, tag)``).

    Returns:
        The data with fewer training rows per client, the held-out rows in
        ``heldout_x``, ``heldout_y`` (client i's at ``heldout_offsets[i]:
        heldout_offsets[i+1]``, each client's in their former order), and
        sample-count weights following the new counts (given weights kept).

    Raises:
        DataError: no client has a row to hold out (naming the field).
    """
    refusal = f"data.client_test_fraction {fraction} holds out no row of any client"
    split = take_rows(data, fraction, seed, _TAG, refusal)
    # client i's held-out rows, as its training rows: by the old offsets
    held_offsets = np.searchsorted(split.taken, data.offsets).astype(np.int64)
    held_x, held_y = split.taken_xy(data)
    return replace(
        split.kept_data(data),
        heldout_x=held_x,
        heldout_y=held_y,
        heldout_offsets=held_offsets,
    )


def with_heldout(spec: DatasetSpec, data: FederatedData, seed: int) -> FederatedData:
    """``data`` with the clients' held-out rows when the ``data`` section
    asks for them (``client_test_fraction`` > 0), else ``data`` itself.

    Args:
        spec: the scenario's ``data`` section.
        data: the clients' rows, the links applied.
        seed: the run's seed.
    """
    fraction = float(getattr(spec, "client_test_fraction", 0.0))
    return split_heldout(data, fraction, seed) if fraction > 0 else data


def heldout_clients(data: FederatedData) -> list[int]:
    """The clients that hold at least one held-out row, ascending (none
    without a held-out split): who can take part in federated evaluation."""
    if data.heldout_offsets is None:
        return []
    return np.flatnonzero(np.diff(data.heldout_offsets) > 0).tolist()


def federated_problem(spec: EvalSpec, data: DatasetSpec, policy: str) -> str | None:
    """Why a scenario's federated evaluation cannot run as written (None: it
    can, or it is off).

    Args:
        spec: the ``eval`` section (``federated_every``).
        data: the ``data`` section (``client_test_fraction``).
        policy: ``round.policy`` (asynchronous versions are refused).
    """
    if spec.federated_every == 0:
        if spec.federated_clients is not None:
            return (
                "eval.federated_clients is set but eval.federated_every is 0 "
                "(federated evaluation is off): set eval.federated_every too"
            )
        return None
    if float(getattr(data, "client_test_fraction", 0.0)) <= 0:
        return (
            f"eval.federated_every is {spec.federated_every}, but "
            "data.client_test_fraction is 0: the clients have no rows of their "
            "own to evaluate on; set data.client_test_fraction (e.g. 0.2)"
        )
    if policy == "async":
        return (
            "eval.federated_every: federated evaluation runs beside synchronous "
            "rounds; round.policy 'async' has none (use fixed_window or "
            "fixed_epochs, or set eval.federated_every: 0)"
        )
    return None
