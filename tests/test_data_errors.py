"""Damaged dataset files: a DataError naming the file (and line), never a
bare traceback or click's "Aborted."."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from fedsim.data import DataError
from fedsim.data.images import MnistData, read_idx
from fedsim.data.tabular import TabularData


def idx_bytes(a: np.ndarray) -> bytes:
    head = bytes([0, 0, 8, a.ndim]) + b"".join(d.to_bytes(4, "big") for d in a.shape)
    return head + a.astype(np.uint8).tobytes()


def test_truncated_gzip_idx_is_a_data_error(tmp_path):
    # Prepare: a valid gzipped IDX file cut in half
    whole = gzip.compress(idx_bytes(np.arange(2000).reshape(20, 10, 10) % 256))
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(whole[: len(whole) // 2])
    # Execute / Assert: not EOFError (which click turns into "Aborted.")
    with pytest.raises(DataError) as exc:
        read_idx(path)
    assert str(exc.value).startswith(f"{path}: damaged gzip file")
    assert "truncated or corrupt" in str(exc.value)


def test_gzip_with_a_corrupt_body_is_a_data_error(tmp_path):
    whole = bytearray(gzip.compress(idx_bytes(np.zeros((4, 5, 5)))))
    whole[12:20] = b"\xff" * 8
    path = tmp_path / "x.gz"
    path.write_bytes(bytes(whole))
    with pytest.raises(DataError, match="damaged gzip file"):
        read_idx(path)


def test_truncated_gzip_through_the_dataset_names_the_file(tmp_path):
    # the files MNIST with files: test reads, the images one truncated
    folder = tmp_path / "mnist"
    folder.mkdir()
    pixels = np.random.default_rng(0).integers(0, 256, (30, 28, 28))
    images = gzip.compress(idx_bytes(pixels))
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(images[:100])
    labels = gzip.compress(idx_bytes(np.arange(30) % 10))
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(labels)
    spec = MnistData(dataset="mnist", root=str(tmp_path), files="test")
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz: damaged gzip"):
        spec.build(3, 0)


# --------------------------------------------------------------------- tabular
def tabular(path, **kw) -> TabularData:
    return TabularData(dataset="tabular", path=str(path), **kw)


def test_ragged_csv_names_the_file_and_line(tmp_path):
    # Prepare: line 4 (the third data row) has one field too few
    path = tmp_path / "t.csv"
    path.write_text("a,b,label\n1,2,0\n3,4,1\n5,1\n7,8,0\n")
    # Execute
    with pytest.raises(DataError) as exc:
        tabular(path).build(2, 0)
    # Assert
    assert str(exc.value).startswith(f"{path}: line 4 has 2 fields but the first")
    assert "has 3" in str(exc.value)


def test_ragged_csv_with_a_quoted_newline_counts_lines(tmp_path):
    # the quoted field spans lines 2-3, so the ragged row is on line 5
    path = tmp_path / "t.csv"
    path.write_text('a;b;label\n1;"x\ny";0\n3;4;1\n5;6;7;8\n')
    with pytest.raises(DataError, match=r"t.csv: line 5 has 4 fields"):
        tabular(path, delimiter=";").build(2, 0)


def test_ragged_gzipped_csv(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"a,b,label\n1,2,0\n3,4,1,9\n"))
    with pytest.raises(DataError, match=r"t.csv.gz: line 3 has 4 fields"):
        tabular(path).build(2, 0)


def test_truncated_gzipped_csv(tmp_path):
    rows = "".join(f"{i},{i + 1},{i % 2}\n" for i in range(2000))
    whole = gzip.compress(("a,b,label\n" + rows).encode())
    path = tmp_path / "t.csv.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError) as exc:
        tabular(path).build(2, 0)
    assert str(exc.value).startswith(f"{path}: ")


def test_garbage_parquet_is_a_data_error(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"t.parquet: cannot read as parquet"):
        tabular(path).build(2, 0)
