"""Partitions: every sample assigned once, the requested skew, seeded."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pydantic import TypeAdapter, ValidationError

from fedsim.data.base import FederatedData
from fedsim.data.partition import (
    PartitionSpec,
    client_sizes,
    dirichlet_feddc,
    dirichlet_fednova,
    iid,
    layout,
    natural,
    partition_table,
    plot_partition,
    pns_mix,
    shards,
    split,
)

from .conftest import assert_figure

# 10 classes x 600 samples, in a scrambled order
LABELS = np.random.default_rng(123).permutation(np.repeat(np.arange(10), 600))
N = LABELS.size

SPECS = [
    {"kind": "iid"},
    {"kind": "iid", "size_sigma": 0.5},
    {"kind": "dirichlet", "alpha": 0.3},
    {"kind": "dirichlet", "alpha": 0.3, "size_sigma": 0.3},
    {"kind": "dirichlet", "alpha": 0.3, "variant": "fednova"},
    {"kind": "shards", "labels_per_client": 2},
]


def _spec(d):
    return TypeAdapter(PartitionSpec).validate_python(d)


def _classes_per_client(parts, labels=LABELS):
    return np.array([len(np.unique(labels[p])) for p in parts])


@pytest.mark.parametrize("d", SPECS, ids=lambda d: "-".join(map(str, d.values())))
def test_every_sample_assigned_exactly_once(d):
    parts = split(_spec(d), LABELS, 30, seed=7)

    assert len(parts) == 30
    assert all(len(p) >= 1 for p in parts)
    every = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(every, np.arange(N))


@pytest.mark.parametrize("d", SPECS, ids=lambda d: "-".join(map(str, d.values())))
def test_same_seed_same_partition_other_seed_other(d):
    a = split(_spec(d), LABELS, 30, seed=7)
    b = split(_spec(d), LABELS, 30, seed=7)
    c = split(_spec(d), LABELS, 30, seed=8)

    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("variant", ["feddc", "fednova"])
def test_fewer_classes_per_client_as_alpha_falls(variant):
    means = []
    for alpha in (100.0, 1.0, 0.3, 0.05):
        parts = split(
            _spec({"kind": "dirichlet", "alpha": alpha, "variant": variant}),
            LABELS,
            40,
            seed=0,
        )
        # classes making up 95% of a client's data: robust to a few strays
        counts = [np.sort(np.bincount(LABELS[p], minlength=10))[::-1] for p in parts]
        k95 = [int(np.searchsorted(np.cumsum(c) / c.sum(), 0.95)) + 1 for c in counts]
        means.append(np.mean(k95))

    assert all(a > b for a, b in zip(means, means[1:], strict=False)), means
    assert means[0] >= 9 and means[-1] <= 4


def test_feddc_sizes_balanced_or_lognormal():
    balanced = dirichlet_feddc(LABELS, 20, alpha=0.5, seed=1)
    skewed = dirichlet_feddc(LABELS, 20, alpha=0.5, seed=1, size_sigma=0.8)

    assert {len(p) for p in balanced} == {300}
    sizes = np.array([len(p) for p in skewed])
    assert sizes.sum() == N and sizes.std() > 50


def test_feddc_class_counts_follow_the_data():
    parts = dirichlet_feddc(LABELS, 25, alpha=0.1, seed=3)
    total = sum(np.bincount(LABELS[p], minlength=10) for p in parts)

    np.testing.assert_array_equal(total, np.bincount(LABELS))


def test_fednova_balance_and_minimum():
    parts = dirichlet_fednova(LABELS, 16, alpha=0.1, seed=0, min_samples=10)
    sizes = np.array([len(p) for p in parts])

    assert sizes.min() >= 10
    # the balance step stops filling a client once it holds N/m samples, so
    # no client ends far above it (at most one class's worth)
    assert sizes.max() <= N / 16 + 600


def test_fednova_impossible_minimum_is_an_error():
    with pytest.raises(ValueError, match="min_samples"):
        dirichlet_fednova(LABELS, 100, alpha=0.3, seed=0, min_samples=100)


def test_shards_give_k_labels():
    parts = shards(LABELS, 30, labels_per_client=2, seed=0)  # shard = 100 samples

    k = _classes_per_client(parts)
    assert k.max() <= 2 and k.mean() > 1.8
    assert {len(p) for p in parts} == {200}


def test_shards_one_label():
    parts = shards(LABELS, 60, labels_per_client=1, seed=0)

    assert set(_classes_per_client(parts)) == {1}


def test_iid_covers_all_classes_and_sizes():
    parts = iid(N, 20, seed=0)
    assert {len(p) for p in parts} == {300}
    assert _classes_per_client(parts).min() == 10
    sizes = client_sizes(1000, 50, sigma=3.0, rng=np.random.default_rng(0))
    assert sizes.sum() == 1000 and sizes.min() >= 1


def test_pns_mix_iid_and_one_label_clients():
    parts = pns_mix(LABELS, 50, iid_fraction=0.3, seed=0, samples_per_client=100)
    k = _classes_per_client(parts)

    assert {len(p) for p in parts} == {100}
    assert len(np.unique(np.concatenate(parts))) == 50 * 100  # disjoint
    assert (k >= 8).sum() == 15  # 30% i.i.d. clients see (almost) all classes
    # the rest hold one label, or two where their shard straddles a boundary
    assert (k <= 2).sum() == 35 and (k == 1).sum() >= 25


def test_pns_mix_two_labels():
    parts = pns_mix(
        LABELS, 20, 0.0, seed=1, labels_per_client=2, samples_per_client=200
    )

    assert _classes_per_client(parts).max() <= 2 + 1


def test_natural_groups():
    groups = np.array([2, 0, 1, 2, 0])
    parts = natural(groups, 3)

    assert [p.tolist() for p in parts] == [[1, 4], [2], [0, 3]]
    with pytest.raises(ValueError, match="no samples"):
        natural(groups, 4)


def test_natural_needs_groups():
    with pytest.raises(ValueError, match="natural"):
        split(_spec({"kind": "natural"}), LABELS, 3, 0)


def test_spec_validation():
    with pytest.raises(ValidationError):
        _spec({"kind": "dirichlet"})  # alpha is required
    with pytest.raises(ValidationError):
        _spec(
            {"kind": "dirichlet", "alpha": 0.3, "variant": "fednova", "size_sigma": 1}
        )
    with pytest.raises(ValidationError):
        _spec({"kind": "shards", "labels": 2})  # unknown key
    with pytest.raises(ValueError, match="at least one sample"):
        iid(3, 5, seed=0)


def test_layout_and_table_and_plot(tmp_path):
    parts = split(_spec({"kind": "dirichlet", "alpha": 0.3}), LABELS, 12, seed=0)
    order, offsets = layout(parts)
    data = FederatedData(
        x=np.zeros((N, 1), np.float32)[order],
        y=LABELS[order],
        offsets=offsets,
        weights=np.diff(offsets).astype(np.float64),
        test_x=np.zeros((1, 1), np.float32),
        test_y=np.zeros(1, np.int64),
        num_classes=10,
    )

    table = partition_table(data)

    assert isinstance(table, pa.Table) and table.num_rows == 12
    hist = np.stack([table.column(f"class_{c}").to_numpy() for c in range(10)], 1)
    for j, p in enumerate(parts):
        np.testing.assert_array_equal(hist[j], np.bincount(LABELS[p], minlength=10))
    np.testing.assert_array_equal(table.column("n_samples").to_numpy(), hist.sum(1))
    np.testing.assert_array_equal(
        table.column("n_classes").to_numpy(), (hist > 0).sum(1)
    )
    out = tmp_path / "partition.png"
    plot_partition(table, out)
    assert_figure(out)
