"""A generic tabular dataset: a CSV or Parquet file with a label column
(fields and an example: docs/datasets.md, "Tabular")."""

from __future__ import annotations

import csv as pycsv
import gzip
import io
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import DatasetSpec, FederatedData
from fedsim.data.errors import DataError, data_root, find_dir
from fedsim.data.partition import IidPartition, PartitionSpec, layout, split
from fedsim.lazy import pa, pc

_TAG_SPLIT = 0x7AB1E
Column = str | Annotated[int, Field(ge=-100_000, le=100_000)]


class TabularData(DatasetSpec):
    """A CSV or Parquet file with a label column (fields: docs/datasets.md)."""

    dataset: Literal["tabular"]
    path: str = Field(min_length=1)
    root: str | None = None
    format: Literal["auto", "csv", "parquet"] = "auto"
    header: bool = True
    delimiter: str = Field(",", min_length=1, max_length=1)
    label: Column = -1
    features: list[Column] | None = None
    client_column: Column | None = None
    standardize: bool = True
    test_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.2
    partition: PartitionSpec = IidPartition(kind="iid")

    clients: ClassVar[int | None] = None  # as many as the fleet has devices

    @model_validator(mode="after")
    def _natural_needs_column(self) -> TabularData:
        if self.partition.kind == "natural" and self.client_column is None:
            raise ValueError("partition 'natural' needs client_column")
        return self

    def locate(self) -> Path:
        p = Path(self.path).expanduser()
        root, _ = data_root(self.root)
        # root / p is p when p is absolute (find_dir drops the repeated folder)
        folders = [p.parent, (root / p).parent]
        how = f"put the file at {root / p}, or give data.path as an absolute path"
        folder = find_dir(f"Tabular data {self.path}", folders, [p.name], how, gz=False)
        return folder / p.name

    def build(self, num_clients: int, seed: int) -> FederatedData:
        table = read_table(self)
        label = _column(table, self.label, "label")
        client = None
        if self.client_column is not None:
            client = _column(table, self.client_column, "client_column")
        if self.features is not None:
            feats = [_column(table, f, "features") for f in self.features]
        else:
            feats = [c for c in table.column_names if c not in (label, client)]
        if not feats:
            raise DataError("tabular: no feature columns")
        cols = []
        for f in feats:
            col = table.column(f)
            if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
                raise DataError(
                    f"tabular: feature column {f!r} is {col.type}, not numeric; "
                    "list the numeric columns in data.features"
                )
            if col.null_count:
                raise DataError(f"tabular: feature column {f!r} has missing values")
            cols.append(pc.cast(col, pa.float64()).to_numpy())
        x = np.stack(cols, axis=1)
        y = _codes(table.column(label), f"label column {label!r}")

        rng = np.random.default_rng(np.random.SeedSequence([int(seed), _TAG_SPLIT]))
        perm = rng.permutation(len(y))
        n_test = max(1, int(round(self.test_fraction * len(y))))
        test, train = perm[:n_test], np.sort(perm[n_test:])

        groups = None
        if self.partition.kind == "natural":
            groups = _codes(table.column(client).take(pa.array(train)), "client_column")
            found = int(groups.max()) + 1
            if found != num_clients:
                raise DataError(
                    f"tabular: client_column {client!r} has {found} distinct values "
                    f"in the training rows but the fleet has {num_clients} devices; "
                    "each device is one client, so they must match"
                )
        parts = split(self.partition, y[train], num_clients, seed, groups=groups)
        order, offsets = layout(parts)
        rows = train[order]
        if self.standardize:  # constant columns are only centred
            mean, std = x[train].mean(axis=0), x[train].std(axis=0)
            x = (x - mean) / np.where(std == 0, 1.0, std)
        return FederatedData(
            x=x[rows].astype(np.float32),
            y=y[rows],
            offsets=offsets,
            weights=np.diff(offsets).astype(np.float64),
            test_x=x[test].astype(np.float32),
            test_y=y[test],
            num_classes=int(y.max()) + 1,
        )


def read_table(spec: TabularData) -> pa.Table:
    """The file as an Arrow table (a CSV without header: ``f0, f1, ...``);
    :class:`DataError` if it cannot be parsed (naming a ragged CSV's bad line)."""
    path, fmt = spec.locate(), spec.format
    if fmt == "auto":
        fmt = "parquet" if path.suffix.lower() in (".parquet", ".pq") else "csv"
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        from pyarrow import csv

        opts = csv.ReadOptions(autogenerate_column_names=not spec.header)
        parse = csv.ParseOptions(delimiter=spec.delimiter)
        return csv.read_csv(path, read_options=opts, parse_options=parse)
    except (pa.ArrowException, OSError, EOFError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        ragged = _ragged_line(path, spec.delimiter) if fmt == "csv" else None
        if ragged is not None:
            line, want, got = ragged
            raise DataError(
                f"{path}: line {line} has {got} fields but the first row has "
                f"{want}; every row needs the same columns (is "
                f"data.delimiter {spec.delimiter!r} right?)"
            ) from None
        raise DataError(
            f"{path}: cannot read as {fmt} ({type(exc).__name__}: {first[:200]})"
        ) from None


def _ragged_line(path: Path, delimiter: str) -> tuple[int, int, int] | None:
    """(line, fields of the first row, fields there) of the first CSV row
    whose field count differs, or None; only called once pyarrow has failed."""
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    try:
        with opener(path, "rb") as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
            reader = pycsv.reader(text, delimiter=delimiter)
            # (line, fields) of the non-empty rows: pyarrow skips empty lines too
            rows = ((reader.line_num, len(row)) for row in reader if row)
            _, want = next(rows, (0, 0))
            return next(((i, want, n) for i, n in rows if n != want), None)
    except (OSError, EOFError, pycsv.Error, UnicodeError):
        return None


def _column(table: pa.Table, col: str | int, what: str) -> str:
    names = table.column_names
    if isinstance(col, int):
        if not -len(names) <= col < len(names):
            raise DataError(f"{what}: column index {col} but the file has {len(names)}")
        return names[col]
    if col not in names:
        raise DataError(f"{what}: no column {col!r}; the file has {names[:20]}")
    return col


def _codes(values: pa.ChunkedArray, what: str) -> np.ndarray:
    """Each value's index among the sorted distinct values."""
    if values.null_count:
        raise DataError(f"{what} has {values.null_count} missing values")
    arr = values.to_numpy(zero_copy_only=False)
    return np.unique(arr, return_inverse=True)[1].reshape(-1).astype(np.int64)
