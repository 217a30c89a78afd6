"""Image datasets: standard files read from a local root, never downloaded."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedsim.data import REGISTRY, DataError, DataMissingError
from fedsim.data.images import (
    Cifar10Data,
    Cifar100Data,
    EmnistData,
    FashionMnistData,
    MnistData,
    read_idx,
)
from fedsim.data.partition import partition_table
from fedsim.scenario import ScenarioError, parse_scenario

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MNIST_TEST = SHARED_DATA / "mnist-test"
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")

needs_mnist = pytest.mark.skipif(
    not (MNIST_TEST / "t10k-images-idx3-ubyte.gz").is_file(),
    reason=f"shared MNIST test set not found at {MNIST_TEST}",
)
needs_fmnist = pytest.mark.skipif(
    not (DEBIAN_FMNIST / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist",
)


@pytest.fixture(autouse=True)
def _no_env_root(monkeypatch, tmp_path):
    # the default root must not pick up a developer's own data
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FEDSIM_DATA_ROOT", raising=False)


def write_idx(path: Path, a: np.ndarray) -> None:
    a = np.ascontiguousarray(a, dtype=np.uint8)
    head = bytes([0, 0, 8, a.ndim]) + b"".join(d.to_bytes(4, "big") for d in a.shape)
    data = head + a.tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


# ---------------------------------------------------------------------- MNIST
@needs_mnist
def test_read_idx_mnist_test_set():
    x = read_idx(MNIST_TEST / "t10k-images-idx3-ubyte.gz")
    y = read_idx(MNIST_TEST / "t10k-labels-idx1-ubyte")  # the .gz is found too

    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    counts = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert np.bincount(y).tolist() == counts
    assert abs(x.mean() / 255 - 0.1325) < 1e-3


@needs_mnist
def test_mnist_test_set_only_split_and_partitioned():
    spec = MnistData(
        dataset="mnist",
        root=str(MNIST_TEST),
        files="test",
        test_fraction=0.2,
        partition={"kind": "dirichlet", "alpha": 0.5},
    )

    data = spec.build(num_clients=10, seed=0)

    assert data.x.shape == (8000, 1, 28, 28) and data.x.dtype == np.float32
    assert data.test_x.shape == (2000, 1, 28, 28)
    assert data.num_clients == 10 and data.n_samples.sum() == 8000
    assert abs(float(data.x.mean())) < 0.05 and abs(float(data.x.std()) - 1) < 0.05
    assert data.y.dtype == np.int64 and data.num_classes == 10
    np.testing.assert_array_equal(data.weights, data.n_samples)
    # the rows really are client-sorted: the table's histogram is the labels'
    t = partition_table(data)
    assert sum(t.column(f"class_{c}").to_numpy().sum() for c in range(10)) == 8000
    again = spec.build(num_clients=10, seed=0)
    np.testing.assert_array_equal(data.y, again.y)
    assert np.array_equal(data.x, again.x)


@needs_mnist
def test_mnist_from_env_root_subfolder(monkeypatch):
    monkeypatch.setenv("FEDSIM_DATA_ROOT", str(SHARED_DATA))  # holds mnist-test/

    data = MnistData(dataset="mnist", files="test", test_samples=100).build(5, 1)

    assert len(data.test_y) == 100 and data.num_clients == 5


@needs_mnist
def test_classes_filter_and_subsets():
    spec = MnistData(
        dataset="mnist",
        root=str(MNIST_TEST),
        files="test",
        classes=[3, 7],
        train_samples=500,
        test_samples=50,
    )

    data = spec.build(num_clients=4, seed=0)

    assert data.num_classes == 2 and set(np.unique(data.y)) == {0, 1}
    assert len(data.y) == 500 and len(data.test_y) == 50


# -------------------------------------------------------------- Fashion-MNIST
@needs_fmnist
def test_fashion_mnist_from_the_debian_package():
    spec = FashionMnistData(
        dataset="fashion_mnist", partition={"kind": "dirichlet", "alpha": 0.3}
    )

    data = spec.build(num_clients=100, seed=0)

    assert data.x.shape == (60000, 1, 28, 28)
    assert data.test_x.shape == (10000, 1, 28, 28)
    assert set(data.n_samples.tolist()) == {600}
    assert np.bincount(data.test_y).tolist() == [1000] * 10
    assert abs(float(data.x.mean())) < 0.01 and abs(float(data.x.std()) - 1) < 0.01
    n_classes = partition_table(data).column("n_classes").to_numpy()
    assert n_classes.mean() < 9.5  # label skew


def test_fashion_mnist_root_with_torchvision_layout(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for part, n in (("train", 40), ("t10k", 10)):
        write_idx(raw / f"{part}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{part}-labels-idx1-ubyte", np.arange(n) % 10)

    data = REGISTRY["fashion_mnist"](dataset="fashion_mnist", root=str(tmp_path)).build(
        4, 0
    )

    assert data.x.shape == (40, 1, 28, 28) and len(data.test_y) == 10


# ------------------------------------------------------------ missing data
def test_missing_dataset_names_paths_and_remedy(tmp_path):
    with pytest.raises(DataMissingError) as e:
        MnistData(dataset="mnist", root=str(tmp_path)).build(4, 0)

    msg = str(e.value)
    assert isinstance(e.value, FileNotFoundError)
    assert str(tmp_path / "mnist") in msg and str(tmp_path) in msg
    assert "train-images-idx3-ubyte" in msg and "files: test" in msg


def test_missing_fashion_mnist_says_apt_get(tmp_path, monkeypatch):
    monkeypatch.setattr(FashionMnistData, "extra_dirs", [tmp_path / "nowhere"])
    monkeypatch.setenv("FEDSIM_DATA_ROOT", str(tmp_path / "root"))

    with pytest.raises(DataMissingError) as e:
        FashionMnistData(dataset="fashion_mnist").build(4, 0)

    msg = str(e.value)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert str(tmp_path / "root" / "fashion-mnist") in msg
    assert str(tmp_path / "nowhere") in msg


def test_default_root_is_the_cache(tmp_path):
    with pytest.raises(DataMissingError) as e:
        Cifar10Data(dataset="cifar10").build(2, 0)

    msg = str(e.value)
    assert str(tmp_path / "home" / ".cache" / "fedsim" / "data") in msg
    assert "cifar-10-batches-bin" in msg and "FEDSIM_DATA_ROOT" in msg


# ------------------------------------------------------------------- CIFAR
def _cifar_bin(path: Path, labels: list[list[int]], rng) -> np.ndarray:
    n = len(labels)
    img = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    path.write_bytes(np.concatenate([np.array(labels, np.uint8), img], 1).tobytes())
    return img


def test_cifar10_binary_version(tmp_path):
    d = tmp_path / "cifar-10-batches-bin"
    d.mkdir()
    rng = np.random.default_rng(0)
    first = _cifar_bin(d / "data_batch_1.bin", [[i % 10] for i in range(20)], rng)
    for i in range(2, 6):
        _cifar_bin(d / f"data_batch_{i}.bin", [[j % 10] for j in range(20)], rng)
    _cifar_bin(d / "test_batch.bin", [[3]] * 7, rng)

    spec = Cifar10Data(dataset="cifar10", root=str(tmp_path), normalize=False)
    data = spec.build(num_clients=5, seed=0)

    assert data.x.shape == (100, 3, 32, 32) and data.test_x.shape == (7, 3, 32, 32)
    assert set(data.test_y.tolist()) == {3}
    # a stored image is some input image, channel-major, scaled to [0, 1]
    flat = (data.x.reshape(100, -1) * 255).round().astype(np.uint8)
    assert any(np.array_equal(row, first[0]) for row in flat)


def test_cifar10_python_version_and_refused_pickle(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (6, 3072), dtype=np.uint8),
            b"labels": [1, 2, 3, 4, 5, 6],
        }
        (d / name).write_bytes(pickle.dumps(batch, protocol=2))

    data = Cifar10Data(dataset="cifar10", root=str(tmp_path)).build(3, 0)
    assert data.x.shape == (30, 3, 32, 32) and sorted(set(data.y)) == [1, 2, 3, 4, 5, 6]

    class Evil:
        def __reduce__(self):
            return (os.getpid, ())

    (d / "test_batch").write_bytes(pickle.dumps({"data": Evil()}))
    with pytest.raises(DataError, match="refusing to unpickle (posix|os).getpid"):
        Cifar10Data(dataset="cifar10", root=str(tmp_path)).build(3, 0)


def test_cifar100_binary_fine_and_coarse(tmp_path):
    d = tmp_path / "cifar-100-binary"
    d.mkdir()
    rng = np.random.default_rng(0)
    _cifar_bin(d / "train.bin", [[i % 20, i] for i in range(100)], rng)
    _cifar_bin(d / "test.bin", [[1, 42]] * 5, rng)

    fine = Cifar100Data(dataset="cifar100", root=str(tmp_path)).build(10, 0)
    coarse = Cifar100Data(dataset="cifar100", root=str(d), labels="coarse").build(10, 0)

    assert fine.num_classes == 100 and sorted(fine.y.tolist()) == list(range(100))
    assert coarse.num_classes == 20 and set(coarse.test_y.tolist()) == {1}


def test_emnist_letters_transposed_and_shifted(tmp_path):
    d = tmp_path / "emnist"
    d.mkdir()
    img = np.zeros((26, 28, 28), np.uint8)
    img[:, 0, 5] = 255  # row 0, column 5 in the file's (transposed) layout
    for part in ("train", "test"):
        write_idx(d / f"emnist-letters-{part}-images-idx3-ubyte.gz", img)
        write_idx(d / f"emnist-letters-{part}-labels-idx1-ubyte.gz", np.arange(1, 27))

    data = EmnistData(dataset="emnist", root=str(tmp_path), normalize=False).build(2, 0)

    assert data.num_classes == 26 and sorted(data.y.tolist()) == list(range(26))
    assert data.x[0, 0, 5, 0] == 1.0 and data.x[0, 0, 0, 5] == 0.0


# ------------------------------------------------------------------ scenario
SCENARIO = """
name: t
rounds: 1
model: {name: cnn}
data: {dataset: fashion_mnist, partition: {kind: dirichlet, alpha: 0.3}}
fleet: {groups: [{name: g, count: 4, speed: {steps_per_s: 1}}]}
algorithm: {name: fedavg}
selector: {name: uniform, clients_per_round: 2}
"""


def test_scenario_data_section_validates():
    sc = parse_scenario(SCENARIO)
    assert sc.data.partition.alpha == 0.3 and sc.data.partition.variant == "feddc"

    with pytest.raises(ScenarioError, match="unknown key"):
        parse_scenario(SCENARIO.replace("alpha: 0.3", "alpha: 0.3, beta: 1"))
    with pytest.raises(ScenarioError, match="natural"):
        parse_scenario(SCENARIO.replace("kind: dirichlet, alpha: 0.3", "kind: natural"))
