"""Shakespeare (one client per role) and the generic tabular loader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedsim.data import DataMissingError
from fedsim.data.shakespeare import LEAF_VOCAB, ShakespeareData, encode, parse_roles
from fedsim.data.tabular import TabularData

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TINY = SHARED_DATA / "tinyshakespeare" / "input.txt"
LETTERS = SHARED_DATA / "opencv-sample-data" / "letter-recognition.data"

needs_tiny = pytest.mark.skipif(
    not TINY.is_file(), reason=f"Tiny Shakespeare not found at {TINY}"
)
needs_letters = pytest.mark.skipif(
    not LETTERS.is_file(), reason=f"UCI letters not found at {LETTERS}"
)

PLAY = """ALICE:
Hello there,
my friend.

BOB:
Hi.

ALICE:
Goodbye now $

Not a role line
but text.

BOB:
And again.
"""


@pytest.fixture(autouse=True)
def _no_env_root(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FEDSIM_DATA_ROOT", raising=False)


# ---------------------------------------------------------------- shakespeare
def test_parse_roles_joins_speeches_like_leaf():
    roles = parse_roles(PLAY)

    assert roles == {
        "ALICE": "Hello there, my friend. Goodbye now $",
        "BOB": "Hi. And again.",
    }


def test_windows_predict_the_next_character(tmp_path):
    (tmp_path / "play.txt").write_text(PLAY)
    spec = ShakespeareData(
        dataset="shakespeare",
        path=str(tmp_path / "play.txt"),
        seq_len=5,
        min_samples=1,
        test_fraction=0.25,
    )

    data = spec.build(num_clients=2, seed=0)

    assert data.num_classes == 80 and data.x.shape[1] == 5
    alice = "Hello there, my friend. Goodbye now  "  # '$' is not in LEAF's vocabulary
    cut = round(len(alice) * 0.75)
    lo, hi = data.offsets[0], data.offsets[1]  # roles in name order: ALICE first
    assert hi - lo == cut - 5
    decoded = ["".join(LEAF_VOCAB[int(c)] for c in row) for row in data.x[lo:hi]]
    targets = [LEAF_VOCAB[int(c)] for c in data.y[lo:hi]]
    assert sorted(d + t for d, t in zip(decoded, targets, strict=True)) == sorted(
        alice[i : i + 6] for i in range(cut - 5)
    )
    # test windows predict characters after the cut, and only those
    test = {"".join(LEAF_VOCAB[int(c)] for c in row) for row in data.test_x}
    assert alice[cut - 5 : cut] in test


def test_encode_unknown_as_space():
    ids = encode("a$b", LEAF_VOCAB)
    assert [LEAF_VOCAB[i] for i in ids] == ["a", " ", "b"]


@needs_tiny
def test_tiny_shakespeare_roles_as_clients():
    roles = parse_roles(TINY.read_text(encoding="utf-8"))
    assert len(roles) == 299
    spec = ShakespeareData(
        dataset="shakespeare",
        path=str(TINY),
        max_clients=12,
        stride=4,
        test_samples=500,
    )

    data = spec.build(num_clients=12, seed=0)

    biggest = sorted(roles, key=lambda r: -len(roles[r]))[:12]
    assert data.num_clients == 12 and data.x.dtype == np.float32
    assert data.y.dtype == np.int64 and data.num_classes == len(LEAF_VOCAB)
    assert len(data.test_y) == 500
    # clients are the 12 largest roles, in name order; sizes follow the text
    expected = [(int(len(roles[r]) * 0.9 + 0.5) - 80 + 3) // 4 for r in sorted(biggest)]
    assert data.n_samples.tolist() == expected
    assert float(data.x.max()) < 80 and data.x.min() >= 0


@needs_tiny
def test_role_count_must_match_the_fleet(monkeypatch):
    spec = ShakespeareData(dataset="shakespeare", path=str(TINY), max_clients=10)
    with pytest.raises(ValueError, match="max_clients: 7"):
        spec.build(num_clients=7, seed=0)

    monkeypatch.setenv("FEDSIM_DATA_ROOT", str(SHARED_DATA))  # tinyshakespeare/
    too_many = ShakespeareData(dataset="shakespeare", max_clients=5000, stride=50)
    with pytest.raises(ValueError, match="roles are kept"):
        too_many.build(num_clients=5000, seed=0)


@needs_tiny
def test_file_vocabulary_and_iid(tmp_path):
    spec = ShakespeareData(
        dataset="shakespeare",
        path=str(TINY),
        max_clients=4,
        stride=16,
        vocab="file",
        partition={"kind": "iid"},
    )
    data = spec.build(4, 0)

    assert data.num_classes == 64  # the file's 65 symbols less "\n"
    assert len(set(data.n_samples.tolist())) <= 2  # iid: equal sizes (+-1)


def test_missing_play_file(tmp_path):
    with pytest.raises(DataMissingError, match="input.txt"):
        ShakespeareData(dataset="shakespeare", root=str(tmp_path)).build(3, 0)


def test_a_gzipped_play_file_is_not_taken_for_the_plain_one(tmp_path):
    # only the IDX reader reads name.gz; the play is read as plain text
    (tmp_path / "shakespeare").mkdir()
    (tmp_path / "shakespeare" / "input.txt.gz").write_bytes(b"")
    with pytest.raises(DataMissingError) as e:
        ShakespeareData(dataset="shakespeare", root=str(tmp_path)).build(3, 0)
    assert "Looked for input.txt in" in str(e.value)


# -------------------------------------------------------------------- tabular
@needs_letters
def test_uci_letters():
    spec = TabularData(
        dataset="tabular",
        path=str(LETTERS),
        header=False,
        label=0,
        partition={"kind": "dirichlet", "alpha": 0.5},
    )

    data = spec.build(num_clients=20, seed=0)

    assert data.x.shape == (16000, 16) and data.test_x.shape == (4000, 16)
    assert data.num_classes == 26 and data.x.dtype == np.float32
    np.testing.assert_allclose(data.x.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(data.x.std(axis=0), 1, atol=1e-4)
    counts = np.bincount(np.concatenate([data.y, data.test_y]))
    assert counts.min() == 734 and counts.max() == 813  # the UCI class sizes


def test_csv_with_header_parquet_and_natural_clients(tmp_path):
    table = pa.table(
        {
            "user": ["u2", "u1", "u2", "u3", "u1", "u3"] * 5,
            "a": np.arange(30, dtype=np.float64),
            "b": np.ones(30, np.int64),
            "y": ["cat", "dog", "cat", "cow", "dog", "cow"] * 5,
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    spec = TabularData(
        dataset="tabular",
        path=str(tmp_path / "t.parquet"),
        label="y",
        client_column="user",
        partition={"kind": "natural"},
        test_fraction=0.2,
    )

    data = spec.build(num_clients=3, seed=0)

    assert data.x.shape == (24, 2) and data.num_classes == 3
    assert data.n_samples.sum() == 24
    assert (data.x[:, 1] == 0).all()  # constant column: centred, not scaled
    with pytest.raises(ValueError, match="3 distinct values"):
        spec.build(num_clients=4, seed=0)


def test_csv_non_numeric_feature(tmp_path):
    (tmp_path / "t.csv").write_text("f,g,label\n1,x,0\n2,y,1\n3,z,0\n4,w,1\n")
    spec = TabularData(dataset="tabular", path=str(tmp_path / "t.csv"), label="label")
    with pytest.raises(ValueError, match="not numeric"):
        spec.build(2, 0)

    ok = TabularData(
        dataset="tabular", path=str(tmp_path / "t.csv"), label=-1, features=["f"]
    )
    assert ok.build(2, 0).x.shape[1] == 1


def test_missing_table_relative_to_root(tmp_path):
    spec = TabularData(dataset="tabular", path="uci/letters.csv", root=str(tmp_path))
    with pytest.raises(DataMissingError) as e:
        spec.build(2, 0)
    assert str(tmp_path / "uci") in str(e.value)
