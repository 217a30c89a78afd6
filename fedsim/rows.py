"""Typed reading of table rows: the rows of rounds.parquet and clients.parquet,
a compare or stress run row, a summary.json mapping.

A row's cells are of a few plain kinds (:data:`Cell`), and which kind a key
holds is fixed by its table's schema (fedsim/results.py). Code that only
passes a row on types it :data:`Row`; code that computes with a cell reads it
through :func:`number`, :func:`whole` or :func:`text`, which check the kind
once and name the key when it is wrong, so that a wrong column fails loudly
where it is read instead of somewhere downstream.

Example:
    >>> row = {"round": 3, "test_accuracy": 0.5, "algorithm": "fedavg"}
    >>> number(row["test_accuracy"]), whole(row["round"]), text(row["algorithm"])
    (0.5, 3, 'fedavg')
"""

from __future__ import annotations

from collections.abc import Mapping

# One cell of a Parquet row or a flat JSON summary: what pyarrow's
# ``to_pylist`` and ``json.loads`` give for the columns fedsim writes.
Cell = bool | int | float | str | None

# A row read only by key; its values are checked where they are used.
Row = Mapping[str, object]


def number(value: object, what: str = "cell") -> float:
    """``value`` as a float: an int or a float (NaN and inf kept).

    Args:
        value: the cell.
        what: how the error names it (the key).

    Returns:
        ``float(value)``, as a plain ``float(...)`` on the cell would.

    Raises:
        TypeError: ``value`` is not a number (None, a string, a bool), naming
            ``what``: a missing value must be handled by the caller, not
            turned into a number here.

    >>> number(2), number(float("inf"))
    (2.0, inf)
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"{what}: expected a number, got {value!r}")


def whole(value: object, what: str = "cell") -> int:
    """``value`` as an int: an int, or a float with no fractional part (a
    column that went through NumPy or JSON as a float).

    Raises:
        TypeError: ``value`` is not a whole number, naming ``what``.

    >>> whole(4), whole(4.0)
    (4, 4)
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TypeError(f"{what}: expected a whole number, got {value!r}")


def text(value: object, what: str = "cell") -> str:
    """``value`` as a str.

    Raises:
        TypeError: ``value`` is not a string, naming ``what``.
    """
    if isinstance(value, str):
        return value
    raise TypeError(f"{what}: expected a string, got {value!r}")


def nullable(value: object, what: str = "cell") -> float:
    """summary.json's null as NaN, any other number as a float.

    >>> nullable(None), nullable(3)
    (nan, 3.0)
    """
    return float("nan") if value is None else number(value, what)
