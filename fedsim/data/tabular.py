"""A generic tabular dataset: a CSV or Parquet file with a label column
(fields and an example: docs/datasets.md, "Tabular").

Columns are named or indexed (negative indices count from the end, as in
Python). Labels of any type become class ids in sorted order of their
distinct values. The train/test split is a seeded random one of the rows,
drawn from its own stream; the training rows are then partitioned, either
by the scenario's partition or, with ``natural``, by a client column.
Features are standardised with the training rows' statistics only, so no
test information leaks into training.
"""

from __future__ import annotations

import csv as pycsv
import gzip
import io
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import DataInfo, DatasetSpec, FederatedData, file_bytes
from fedsim.data.errors import DataError, data_root, find_dir
from fedsim.data.partition import IidPartition, PartitionSpec, layout, split
from fedsim.lazy import pa, pc

_TAG_SPLIT = 0x7AB1E  # the train/test split's own stream of the scenario seed
# a column name, or an index (bounded so a YAML typo cannot be a huge number)
Column = str | Annotated[int, Field(ge=-100_000, le=100_000)]


class TabularData(DatasetSpec):
    """A CSV or Parquet file with a label column (fields: docs/datasets.md).

    ``features`` defaults to every column but the label and client columns;
    every feature must be numeric and complete (no imputation is guessed).
    """

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
        """Reject ``natural`` without ``client_column`` when the scenario loads."""
        if self.partition.kind == "natural" and self.client_column is None:
            raise ValueError("partition 'natural' needs client_column")
        return self

    def locate(self) -> Path:
        """The file: ``path`` as given, else relative to the data root.

        Raises:
            DataMissingError: The file is in neither place.
        """
        p = Path(self.path).expanduser()
        root, _ = data_root(self.root)
        # root / p is p when p is absolute (find_dir drops the repeated folder)
        folders = [p.parent, (root / p).parent]
        how = f"put the file at {root / p}, or give data.path as an absolute path"
        folder = find_dir(f"Tabular data {self.path}", folders, [p.name], how, gz=False)
        return folder / p.name

    def info(self, num_clients: int) -> DataInfo:
        """Vectors of the feature columns (from ``features``, else the file's
        header or schema); the row count guessed from the file size.

        Args:
            num_clients: Unused: the shape does not depend on the clients.
        """
        n = self._feature_count()
        size = file_bytes(self.locate)
        # a CSV value takes a few text bytes and 4 to 8 bytes once parsed
        samples = max(1, size // (2 * (n + 1))) if size is not None and n else None
        return DataInfo("vector", None if n is None else (n,), None, samples)

    def _feature_count(self) -> int | None:
        """Feature columns, from ``features`` or the first line / Parquet schema
        alone; None where the file cannot be read (building the data says why)."""
        if self.features is not None:
            return len(self.features)
        try:
            path = self.locate()
            parquet_suffix = path.suffix.lower() in (".parquet", ".pq")
            if self.format == "parquet" or (self.format == "auto" and parquet_suffix):
                # imported here: validate must not load pyarrow for a CSV
                import pyarrow.parquet as pq

                n = len(pq.read_schema(path).names)
            else:
                with path.open("rb") as f:
                    first = f.readline(1 << 20)  # a header, not the whole file
                n = first.count(self.delimiter.encode()) + 1
        except Exception:  # noqa: BLE001 - building the data reports it properly
            return None
        return max(0, n - 1 - (self.client_column is not None))

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """Read the file, split train/test, partition, standardise.

        Args:
            num_clients: The clients (with ``natural``, must equal the
                distinct values of the client column in the training rows).
            seed: The scenario seed (the split and the partition).

        Returns:
            float32 features and int64 class ids, the training rows stored
            client after client; ``num_classes`` counts the distinct labels
            of the whole file.

        Raises:
            DataMissingError: The file is not there.
            DataError: The file cannot be parsed, a column is missing, not
                numeric or incomplete, or the clients do not match.
        """
        table = read_table(self)
        label = _column(table, self.label, "label")
        client = None
        if self.client_column is not None:
            client = _column(table, self.client_column, "client_column")
        x = _features(table, self.features, (label, client))
        y = _codes(table.column(label), f"label column {label!r}")

        rng = np.random.default_rng(np.random.SeedSequence([int(seed), _TAG_SPLIT]))
        perm = rng.permutation(len(y))
        # at least one test row, so the test metrics always exist
        n_test = max(1, int(round(self.test_fraction * len(y))))
        # training rows sorted: the partition sees them in file order
        test, train = perm[:n_test], np.sort(perm[n_test:])

        groups = None
        if self.partition.kind == "natural":
            groups = _client_codes(table, client, train, num_clients)
        parts = split(self.partition, y[train], num_clients, seed, groups=groups)
        order, offsets = layout(parts)
        rows = train[order]
        if self.standardize:  # constant columns are only centred
            # training rows' statistics only: the test set must not leak in
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


def _features(
    table: pa.Table, features: list[Column] | None, others: tuple[str, str | None]
) -> np.ndarray:
    """The feature columns as float64 [rows, features].

    Args:
        table: The file.
        features: The columns asked for; None: every column but ``others``.
        others: The label and client columns.

    Raises:
        DataError: No feature column, or one that is missing, not numeric or
            has missing values.
    """
    if features is not None:
        feats = [_column(table, f, "features") for f in features]
    else:
        feats = [c for c in table.column_names if c not in others]
    if not feats:
        raise DataError("tabular: no feature columns")
    return np.stack([_numeric(table, f) for f in feats], axis=1)


def _numeric(table: pa.Table, name: str) -> np.ndarray:
    """Feature column ``name`` as float64.

    Raises:
        DataError: The column is not numeric or has missing values.
    """
    col = table.column(name)
    # strings or dates would need an encoding fedsim cannot guess
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise DataError(
            f"tabular: feature column {name!r} is {col.type}, not numeric; "
            "list the numeric columns in data.features"
        )
    if col.null_count:
        raise DataError(f"tabular: feature column {name!r} has missing values")
    return pc.cast(col, pa.float64()).to_numpy()


def _client_codes(
    table: pa.Table, client: str | None, train: np.ndarray, num_clients: int
) -> np.ndarray:
    """Each training row's client id, 0..num_clients-1, from the client column.

    Coded over the training rows only: a client whose rows all went to the
    test set would otherwise be a client without data.

    Raises:
        DataError: The training rows hold another number of clients.
    """
    groups = _codes(table.column(client).take(pa.array(train)), "client_column")
    found = int(groups.max()) + 1
    if found != num_clients:
        raise DataError(
            f"tabular: client_column {client!r} has {found} distinct values "
            f"in the training rows but the fleet has {num_clients} devices; "
            "each device is one client, so they must match"
        )
    return groups


def read_table(spec: TabularData) -> pa.Table:
    """The file as an Arrow table (a CSV without header: ``f0, f1, ...``).

    ``format: auto`` reads .parquet and .pq as Parquet, anything else as
    CSV (pyarrow reads a .csv.gz itself).

    Raises:
        DataMissingError: The file is not there.
        DataError: It cannot be parsed; for a ragged CSV the message names
            the first bad line, which pyarrow's own message does not.
    """
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
        # pyarrow's messages run long: the first line, cut at 200 characters
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
    """The name of column ``col`` (a name, or an index as in Python).

    Raises:
        DataError: No such column; ``what`` names the field that asked.
    """
    names = table.column_names
    if isinstance(col, int):
        if not -len(names) <= col < len(names):
            raise DataError(f"{what}: column index {col} but the file has {len(names)}")
        return names[col]
    if col not in names:
        raise DataError(f"{what}: no column {col!r}; the file has {names[:20]}")
    return col


def _codes(values: pa.ChunkedArray, what: str) -> np.ndarray:
    """Each value's index among the sorted distinct values.

    Sorted, so the codes do not depend on row order: the same labels give
    the same class ids whatever the split.

    Raises:
        DataError: A value is missing.
    """
    if values.null_count:
        raise DataError(f"{what} has {values.null_count} missing values")
    arr = values.to_numpy(zero_copy_only=False)
    return np.unique(arr, return_inverse=True)[1].reshape(-1).astype(np.int64)
