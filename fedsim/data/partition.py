"""Federated partitions: which client holds which training samples.

Each partition is a pure function of ``(labels, parameters, seed)`` returning
one array of sample indices per client; the kinds, their guarantees and
their deviations from the reference codes: docs/datasets.md ("Partitions").

The order of the random draws in each function is part of its contract: a
scenario's partition must stay bit-identical across fedsim versions, so a
refactor may not reorder, merge or skip a draw, even one whose result looks
unused. Every partition draws from its own stream (:func:`_rng`), so adding
a partition parameter never shifts the draws of the model or the fleet.

:func:`split` dispatches a scenario's :data:`PartitionSpec`;
:func:`partition_table` describes the result for a run directory
(partition.parquet, written by the run); :func:`plot_partition` draws it
(partition.png, written by the report).

Example:
    >>> labels = np.repeat(np.arange(10), 100)
    >>> parts = dirichlet_feddc(labels, num_clients=20, alpha=0.3, seed=0)
    >>> sorted(np.concatenate(parts).tolist()) == list(range(1000))
    True
    >>> [len(p) for p in parts][:3]
    [50, 50, 50]
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import FederatedData
from fedsim.data.errors import DataError
from fedsim.lazy import pa
from fedsim.spec import PosFloat, PosInt, Prob, Spec

_TAG = 0x9A27  # separates the partition's random stream from other uses of the seed


class IidPartition(Spec):
    """Uniform random split; ``size_sigma`` > 0 gives lognormal client sizes.

    The cap of 5 on ``size_sigma`` keeps the lognormal from giving one client
    nearly every sample (at sigma 5 the largest of 100 clients typically
    holds over half of the data).
    """

    kind: Literal["iid"]
    size_sigma: Annotated[float, Field(ge=0, le=5)] = 0.0


class DirichletPartition(Spec):
    """Dirichlet label skew (docs/algorithms.md 2.3 ``fednova``, 2.4 ``feddc``);
    ``size_sigma`` is feddc's only, ``min_samples`` fednova's."""

    kind: Literal["dirichlet"]
    alpha: PosFloat
    variant: Literal["feddc", "fednova"] = "feddc"
    size_sigma: Annotated[float, Field(ge=0, le=5)] = 0.0
    min_samples: Annotated[int, Field(ge=1, le=1_000_000)] = 10

    @model_validator(mode="after")
    def _variant_fields(self) -> DirichletPartition:
        """Reject ``size_sigma`` with the fednova variant, which ignores it.

        A silently ignored field would let a scenario claim unbalanced
        sizes it never got.
        """
        if self.variant == "fednova" and self.size_sigma > 0:
            raise ValueError(
                "size_sigma applies to variant 'feddc' only; the fednova variant "
                "draws client sizes from the Dirichlet proportions"
            )
        return self


class ShardsPartition(Spec):
    """FedAvg's shards: each client gets ``labels_per_client`` label-sorted shards."""

    kind: Literal["shards"]
    labels_per_client: PosInt = 2


class PnsMixPartition(Spec):
    """FedPNS (docs/algorithms.md 2.5): ``iid_fraction`` of the clients i.i.d., the
    rest label shards; ``samples_per_client`` default: n // clients."""

    kind: Literal["pns_mix"]
    iid_fraction: Prob
    labels_per_client: PosInt = 1
    samples_per_client: PosInt | None = None


class NaturalPartition(Spec):
    """The dataset's own clients (Shakespeare roles, a tabular client column)."""

    kind: Literal["natural"]


PartitionSpec = Annotated[
    IidPartition
    | DirichletPartition
    | ShardsPartition
    | PnsMixPartition
    | NaturalPartition,
    Field(discriminator="kind"),
]


def _rng(seed: int) -> np.random.Generator:
    """The partition's generator: the scenario seed with :data:`_TAG` mixed in.

    A SeedSequence of two words, not ``seed + _TAG``, so that no other seed
    can collide with it.
    """
    return np.random.default_rng(np.random.SeedSequence([int(seed), _TAG]))


def _check(n: int, num_clients: int) -> None:
    """Raise DataError unless ``n`` samples can give each client one."""
    if num_clients < 1:
        raise DataError(f"need at least one client, got {num_clients}")
    if n < num_clients:
        raise DataError(
            f"{n} training samples cannot give each of {num_clients} clients "
            "at least one sample"
        )


def _num_classes(labels: np.ndarray) -> int:
    """``max(labels) + 1`` (0 for no labels); DataError on a negative label.

    Classes are counted from the labels, not the dataset, so a class absent
    from the training set simply has an empty pool.
    """
    if labels.size and labels.min() < 0:
        raise DataError("labels must be non-negative class ids")
    return int(labels.max()) + 1 if labels.size else 0


def client_sizes(
    n: int, num_clients: int, sigma: float, rng: np.random.Generator
) -> np.ndarray:
    """Client sizes summing to ``n`` (docs/algorithms.md 2.4 step 2).

    Sizes are LogNormal(log(n/m), sigma), rescaled to sum to ``n`` and
    rounded by largest remainders; a client left with no sample gets one
    from the largest.

    Args:
        n: The samples to share out.
        num_clients: The clients, m.
        sigma: The lognormal's sigma; 0 gives sizes within one of n/m.
        rng: The partition's generator; ``m`` lognormal draws are taken
            from it even when sigma is 0, so the later draws do not depend
            on sigma being 0.

    Returns:
        int64 sizes, each at least 1, summing to ``n``.

    Raises:
        DataError: ``num_clients`` < 1 or ``n`` < ``num_clients``.
    """
    _check(n, num_clients)
    s = rng.lognormal(np.log(n / num_clients), sigma, num_clients)
    q = s / s.sum() * n
    sizes = np.floor(q).astype(np.int64)
    extra = n - int(sizes.sum())
    # largest remainders; "stable": equal remainders go to the lower client id
    sizes[np.argsort(-(q - sizes), kind="stable")[:extra]] += 1
    for j in np.flatnonzero(sizes < 1):
        sizes[np.argmax(sizes)] -= 1 - sizes[j]
        sizes[j] = 1
    return sizes


def iid(
    n: int, num_clients: int, seed: int, size_sigma: float = 0.0
) -> list[np.ndarray]:
    """A uniform random split of ``range(n)``; lognormal sizes if ``size_sigma``.

    Args:
        n: The training samples.
        num_clients: The clients.
        seed: The scenario seed.
        size_sigma: The sigma of :func:`client_sizes`.

    Returns:
        One index array per client: disjoint, together ``range(n)``.
    """
    rng = _rng(seed)
    sizes = client_sizes(n, num_clients, size_sigma, rng)
    return np.split(rng.permutation(n), np.cumsum(sizes)[:-1])


def dirichlet_feddc(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    size_sigma: float = 0.0,
) -> list[np.ndarray]:
    """Dirichlet label skew, FedDyn/FedDC variant (docs/algorithms.md 2.4).

    Client sizes are fixed first; each client draws a class prior
    Dir(alpha). Then, sample by sample, a random client with room draws a
    class from its prior restricted to the classes left, and gets that
    class's next sample, until every client is full.

    Args:
        labels: Each training sample's class id.
        num_clients: The clients.
        alpha: The Dirichlet concentration (small: few classes per client).
        seed: The scenario seed.
        size_sigma: The sigma of :func:`client_sizes`.

    Returns:
        One index array per client: disjoint, together every sample, of the
        sizes :func:`client_sizes` gives.

    Raises:
        DataError: Fewer samples than clients, or a negative label.
    """
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.size
    rng = _rng(seed)
    num_classes = _num_classes(labels)
    # draw order (permutation, sizes, priors, then all uniforms) is fixed:
    # changing it would change every existing scenario's partition
    order = rng.permutation(n)
    sizes = client_sizes(n, num_clients, size_sigma, rng)
    priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
    # one shuffled pool per class, dealt from its end (pools[c][left[c]])
    shuffled = labels[order]
    pools = [order[shuffled == c] for c in range(num_classes)]
    left = np.array([len(p) for p in pools], dtype=np.int64)

    def cdfs() -> list[list[float]]:
        """Each client's prior over the classes left, as a cumulative row.

        A client whose prior is 0 on every class left draws uniformly among
        them (the reference code would loop forever there). Plain lists:
        bisect on a list is far faster than NumPy on one short row.
        """
        avail = (left > 0).astype(np.float64)
        p = priors * avail
        p[p.sum(axis=1) <= 0] = avail
        return np.cumsum(p, axis=1).tolist()

    cdf = cdfs()
    parts = [np.empty(s, dtype=np.int64) for s in sizes]
    fill = np.zeros(num_clients, dtype=np.int64)
    open_ = list(range(num_clients))  # the clients with room, in no fixed order
    # all uniforms up front: one (client, class) pair per sample; picking among
    # open clients and classes left replaces the reference's redraw loop with
    # the same distribution
    u = rng.random((n, 2))
    for t in range(n):
        k = int(u[t, 0] * len(open_))
        j = open_[k]
        row = cdf[j]
        c = min(bisect.bisect_right(row, u[t, 1] * row[-1]), num_classes - 1)
        while left[c] == 0:  # rounding at the very top of the CDF
            c -= 1
        left[c] -= 1
        parts[j][fill[j]] = pools[c][left[c]]
        fill[j] += 1
        if fill[j] == sizes[j]:
            # swap-remove: O(1), and the order it leaves is part of the draws
            open_[k] = open_[-1]
            open_.pop()
        if left[c] == 0:
            # only when a class runs out do the CDFs change (at most C times)
            cdf = cdfs()
    return parts


def dirichlet_fednova(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    min_samples: int = 10,
    max_passes: int = 1000,
) -> list[np.ndarray]:
    """Dirichlet label skew, FedNova variant (docs/algorithms.md 2.3).

    Per class, proportions Dir(alpha) over the clients still holding under
    n/m ("balance"); the whole pass repeats until every client holds
    ``min_samples``.

    Args:
        labels: Each training sample's class id.
        num_clients: The clients, m.
        alpha: The Dirichlet concentration.
        seed: The scenario seed.
        min_samples: The fewest samples a client may hold.
        max_passes: Passes to try before giving up.

    Returns:
        One shuffled index array per client: disjoint, together every
        sample, each at least ``min_samples`` long.

    Raises:
        DataError: ``min_samples * m`` exceeds the samples, or no pass within
            ``max_passes`` met ``min_samples`` (alpha too small).
    """
    labels = np.asarray(labels, dtype=np.int64)
    n, m = labels.size, num_clients
    _check(n, m)
    if min_samples * m > n:
        raise DataError(
            f"min_samples={min_samples} for {m} clients needs {min_samples * m} "
            f"samples, the training set has {n}"
        )
    rng = _rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in range(_num_classes(labels))]
    for _ in range(max_passes):
        # a failed pass's draws are not undone: the next pass continues the
        # stream, as the reference's while loop does
        pieces, held = _fednova_pass(by_class, n, m, alpha, rng)
        if held.min() >= min_samples:
            return [rng.permutation(np.concatenate(ps)) for ps in pieces]
    raise DataError(
        f"dirichlet (fednova): after {max_passes} passes some client still holds "
        f"fewer than {min_samples} samples; raise alpha or lower min_samples"
    )


def _fednova_pass(
    by_class: list[np.ndarray], n: int, m: int, alpha: float, rng: np.random.Generator
) -> tuple[list[list[np.ndarray]], np.ndarray]:
    """One pass of :func:`dirichlet_fednova`: every class cut among the clients.

    Args:
        by_class: Each class's sample indices.
        n: The training samples.
        m: The clients.
        alpha: The Dirichlet concentration.
        rng: The partition's generator (a permutation, then a Dirichlet draw,
            per class, in class order).

    Returns:
        ``(pieces, held)``: each client's pieces and its sample count.
    """
    pieces: list[list[np.ndarray]] = [[] for _ in range(m)]
    held = np.zeros(m, dtype=np.int64)
    for idx in by_class:
        idx = rng.permutation(idx)
        # "balance": a client already at n/m gets nothing more of any class
        room = held < n / m
        p = rng.dirichlet(np.full(m, float(alpha))) * room
        if p.sum() <= 0:  # every open client drew exactly 0: share evenly
            p = room.astype(np.float64)
        # cut points by truncation, as the reference code's astype(int) does
        cuts = (np.cumsum(p / p.sum()) * len(idx)).astype(np.int64)[:-1]
        for j, piece in enumerate(np.split(idx, cuts)):
            pieces[j].append(piece)
            held[j] += len(piece)
    return pieces, held


def shards(
    labels: np.ndarray, num_clients: int, labels_per_client: int, seed: int
) -> list[np.ndarray]:
    """FedAvg's pathological non-IID split (McMahan et al. 2017, section 3).

    The samples, sorted by label, are cut into ``m * k`` equal shards (sizes
    differ by at most one); each client gets ``k`` random shards. A shard can
    straddle two labels, so a client may hold more than ``k`` labels.

    Args:
        labels: Each training sample's class id.
        num_clients: The clients, m.
        labels_per_client: Shards per client, k.
        seed: The scenario seed.

    Returns:
        One index array per client: disjoint, together every sample.

    Raises:
        DataError: Fewer samples than shards.
    """
    labels = np.asarray(labels, dtype=np.int64)
    n, k = labels.size, labels_per_client
    n_shards = num_clients * k
    _check(n, n_shards)
    rng = _rng(seed)
    # shuffle, then a stable sort by label: random order within each label,
    # so a shard holds random samples of its label, not the dataset's first
    order = rng.permutation(n)
    order = order[np.argsort(labels[order], kind="stable")]
    bounds = np.arange(n_shards + 1) * n // n_shards
    pick = rng.permutation(n_shards).reshape(num_clients, k)
    return [
        # shards in index order within a client: its samples stay label-sorted
        np.concatenate([order[bounds[s] : bounds[s + 1]] for s in sorted(row)])
        for row in pick
    ]


def pns_mix(
    labels: np.ndarray,
    num_clients: int,
    iid_fraction: float,
    seed: int,
    labels_per_client: int = 1,
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """FedPNS's mix of i.i.d. and label-skewed clients (docs/algorithms.md 2.5).

    ``round(iid_fraction * m)`` random clients get ``samples_per_client``
    uniform samples, the others ``labels_per_client`` random shards of the
    label-sorted rest; samples not drawn are unused.

    Args:
        labels: Each training sample's class id.
        num_clients: The clients, m.
        iid_fraction: The share of i.i.d. clients.
        seed: The scenario seed.
        labels_per_client: Shards per skewed client, k.
        samples_per_client: Samples per client (default: n // m); a skewed
            client's shards are ``samples_per_client // k`` long each.

    Returns:
        One index array per client, disjoint; client ids are in random
        order, so i.i.d. clients are not the first ids.

    Raises:
        DataError: Too few samples for the clients, or for the shards.
    """
    labels = np.asarray(labels, dtype=np.int64)
    n, m, k = labels.size, num_clients, labels_per_client
    nc = samples_per_client or n // max(m, 1)
    _check(n, m)
    if nc * m > n:
        raise DataError(
            f"samples_per_client={nc} for {m} clients needs {nc * m} samples, "
            f"the training set has {n}"
        )
    shard = nc // k
    if shard < 1:
        raise DataError(
            f"samples_per_client={nc} cannot be cut into {k} shards per client"
        )
    rng = _rng(seed)
    # Python's round: a half goes to the even count (0.5 * 5 clients -> 2)
    m_iid = int(round(iid_fraction * m))
    is_iid = rng.permutation(m) < m_iid
    order = rng.permutation(n)
    iid_pool, rest = order[: m_iid * nc], order[m_iid * nc :]
    rest = rest[np.argsort(labels[rest], kind="stable")]
    need = (m - m_iid) * k
    avail = len(rest) // shard
    if need > avail:
        raise DataError(f"pns_mix needs {need} label shards, the data has {avail}")
    picks = rng.choice(avail, size=need, replace=False).reshape(m - m_iid, k)
    # i.i.d. and shard clients each take their parts in client-id order
    iid_parts = iter(iid_pool.reshape(m_iid, nc))
    shard_parts = (
        np.concatenate([rest[s * shard : (s + 1) * shard] for s in row])
        for row in picks
    )
    return [next(iid_parts) if flag else next(shard_parts) for flag in is_iid]


def natural(groups: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """The dataset's own clients: ``groups[s]`` is sample s's client id.

    Args:
        groups: Each sample's client id, 0 to ``num_clients - 1``.
        num_clients: The clients.

    Returns:
        One index array per client, sample ids ascending; samples with an id
        outside the range belong to no client.

    Raises:
        DataError: A client has no samples (a scenario asking for more
            clients than the dataset has).
    """
    groups = np.asarray(groups, dtype=np.int64).ravel()
    order = np.argsort(groups, kind="stable")  # ascending sample ids per client
    # where each client's run starts in ``groups[order]`` (ids outside
    # 0..num_clients-1 fall before the first run or after the last)
    bounds = np.searchsorted(groups[order], np.arange(num_clients + 1))
    parts = [order[bounds[j] : bounds[j + 1]] for j in range(num_clients)]
    empty = [j for j, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise DataError(f"natural partition: clients {empty[:5]} have no samples")
    return parts


def split(
    spec: PartitionSpec,
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Partition a training set as a scenario's ``partition`` says.

    Args:
        spec: The partition spec.
        labels: Each training sample's class id.
        num_clients: The clients.
        seed: The scenario seed.
        groups: Each sample's own client id, for ``natural`` (None when the
            dataset has no clients of its own).

    Returns:
        One index array per client.

    Raises:
        DataError: The partition cannot be made (see each kind), or
            ``natural`` without ``groups``.
    """
    m = num_clients
    if spec.kind == "iid":
        return iid(len(labels), m, seed, spec.size_sigma)
    if spec.kind == "dirichlet" and spec.variant == "feddc":
        return dirichlet_feddc(labels, m, spec.alpha, seed, spec.size_sigma)
    if spec.kind == "dirichlet":
        return dirichlet_fednova(labels, m, spec.alpha, seed, spec.min_samples)
    if spec.kind == "shards":
        return shards(labels, m, spec.labels_per_client, seed)
    if spec.kind == "pns_mix":
        k, nc = spec.labels_per_client, spec.samples_per_client
        return pns_mix(labels, m, spec.iid_fraction, seed, k, nc)
    if groups is None:
        raise DataError(
            "partition 'natural' needs a dataset with its own clients "
            "(shakespeare, or tabular with client_column)"
        )
    return natural(groups, m)


def layout(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(row order, offsets) that store the clients' samples one after another,
    as :class:`~fedsim.data.base.FederatedData` does.

    Returns:
        ``(order, offsets)``: rows ``order[offsets[i]:offsets[i + 1]]`` of the
        training set are client i's, in its part's order.
    """
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
    # the empty int64 array fixes the dtype when there are no parts
    order = np.concatenate([np.zeros(0, np.int64), *parts])
    return order.astype(np.int64), offsets.astype(np.int64)


def label_histogram(data: FederatedData) -> np.ndarray:
    """int64 [clients, classes]: how many samples of each class each client holds."""
    m, c = data.num_clients, data.num_classes
    if c <= 0:
        return np.zeros((m, 0), dtype=np.int64)
    # one bincount over (client, class) pairs instead of one per client
    client = np.repeat(np.arange(m, dtype=np.int64), data.n_samples)
    y = np.asarray(data.y, dtype=np.int64)
    return np.bincount(client * c + y, minlength=m * c).reshape(m, c)


def partition_table(data: FederatedData) -> pa.Table:
    """One row per client: ``client_id``, ``n_samples``, ``weight``,
    ``n_classes`` (labels held) and ``class_<c>`` (samples of class c).

    >>> from fedsim.data.synthetic import SyntheticData
    >>> t = partition_table(SyntheticData(dataset="synthetic").build(5, 0))
    >>> t.column_names[:5], t.num_rows
    (['client_id', 'n_samples', 'weight', 'n_classes', 'class_0'], 5)
    """
    hist = label_histogram(data)
    cols: dict[str, pa.Array] = {
        "client_id": pa.array(np.arange(data.num_clients, dtype=np.int64)),
        "n_samples": pa.array(data.n_samples.astype(np.int64)),
        "weight": pa.array(np.asarray(data.weights, dtype=np.float64)),
        "n_classes": pa.array((hist > 0).sum(axis=1).astype(np.int64)),
        **{f"class_{c}": pa.array(hist[:, c]) for c in range(hist.shape[1])},
    }
    return pa.table(cols)


def plot_partition(table: pa.Table, path: str | Path, max_clients: int = 100) -> None:
    """Stacked per-client label histograms of the first ``max_clients`` clients.

    A PNG written atomically (Agg backend, no pyplot state: safe in any
    thread, and the same bytes for the same table).

    Args:
        table: :func:`partition_table`'s table.
        path: Where the PNG goes.
        max_clients: The most clients drawn; more would be too thin to see.
    """
    # imported here: matplotlib is slow to import and only drawing needs it
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    m = min(table.num_rows, max_clients)
    classes = [c for c in table.column_names if c.startswith("class_")]
    fig = Figure(figsize=(min(24.0, max(6.0, 0.12 * m + 2.0)), 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(m)
    if not classes:  # no labels (e.g. a regression): sizes only
        ax.bar(x, np.asarray(table.column("n_samples"))[:m], width=0.9)
    else:
        _stack_classes(ax, table, classes, m, colormaps)
    shown = f" (first {m} of {table.num_rows})" if m < table.num_rows else ""
    ax.set(
        title=f"Samples per client by class{shown}", xlabel="client", ylabel="samples"
    )
    # past 40 clients their ids would overlap; matplotlib's ticks then do
    if m <= 40:
        ax.set_xticks(x, [str(i) for i in table.column("client_id").to_pylist()[:m]])
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    from fedsim.results import atomic_write_bytes

    atomic_write_bytes(Path(path), buf.getvalue())


def _stack_classes(
    ax: Any, table: pa.Table, classes: list[str], m: int, colormaps: Any
) -> None:
    """One stacked bar per client, a segment per class, and the class legend.

    Listed colour maps up to 20 classes, so neighbouring classes differ;
    viridis past that, with no legend (it would cover the bars).
    """
    x = np.arange(m)
    cmap = colormaps["tab10" if len(classes) <= 10 else "tab20"]
    if len(classes) > 20:
        cmap = colormaps["viridis"].resampled(len(classes))
    bottom = np.zeros(m)
    for i, name in enumerate(classes):
        h = np.asarray(table.column(name))[:m].astype(np.float64)
        ax.bar(x, h, bottom=bottom, width=0.9, color=cmap(i), label=name[6:])
        bottom += h
    if len(classes) <= 20:
        # outside the axes, right: inside it would cover the first clients
        ax.legend(
            title="class", fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0)
        )
