"""Locating dataset files on disk (docs/datasets.md, "Where data comes from"),
and the errors raised when they are missing or do not fit (CLI exit code 2).

Example:
    >>> try:
    ...     find_dir("Example", [Path("/nonexistent")], ["a.bin"], "put a.bin there")
    ... except DataMissingError as e:
    ...     print(str(e).splitlines()[0])
    Example: data not found.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fedsim.errors import LoadError

ENV_ROOT = "FEDSIM_DATA_ROOT"
DEFAULT_ROOT = Path("~/.cache/fedsim/data")


class DataMissingError(LoadError, FileNotFoundError):
    """A dataset's files are not on disk; the message (for the user, as is)
    names every path looked at and how to obtain the data."""


class DataError(LoadError, ValueError):
    """The data cannot be built as the scenario asks (a partition that does
    not fit, a client count that does not match the fleet, a non-numeric
    feature column); the message is meant for the user."""


def data_root(root: str | None) -> tuple[Path, bool]:
    """The data root, and whether it is the scenario's own ``root`` (which
    may also be the dataset's folder itself; the others hold one subfolder
    per dataset)."""
    if root:
        return Path(root).expanduser(), True
    return Path(os.environ.get(ENV_ROOT) or DEFAULT_ROOT).expanduser(), False


def missing(
    what: str, files: str, looked: Sequence[Path], how: str
) -> DataMissingError:
    """The :class:`DataMissingError` for ``what``'s ``files`` not in ``looked``.

    Args:
        what: The dataset, as the user knows it ("CIFAR-10").
        files: The files expected, as one readable string.
        looked: Every folder searched, in order.
        how: How to obtain the files.

    Returns:
        The error (the caller raises it), its message ready for the user.
    """
    folders = "\n".join(f"  {p}" for p in looked)
    return DataMissingError(
        f"{what}: data not found.\n"
        f"Looked for {files} in:\n{folders}\n"
        f"How to get it: {how}\n"
        f"(fedsim never downloads data; set data.root in the scenario or the "
        f"{ENV_ROOT} environment variable to the folder that holds it.)"
    )


def find_dir(
    what: str,
    candidates: Sequence[Path],
    names: Sequence[str],
    how_to_get: str,
    gz: bool = True,
) -> Path:
    """The first of ``candidates`` holding every file in ``names`` (each as
    is or, with ``gz``, as ``name.gz``); else :class:`DataMissingError`.

    A folder must hold all the files: a half-copied dataset elsewhere must
    not shadow a complete one later in the list.

    Raises:
        DataMissingError: No candidate holds them all.
    """
    # each folder once, in order (a root given twice is searched once)
    seen = list(dict.fromkeys(candidates))
    suffixes = ("", ".gz") if gz else ("",)
    for folder in seen:
        if all(any((folder / f"{n}{s}").is_file() for s in suffixes) for n in names):
            return folder
    files = ", ".join(f"{n}[.gz]" if gz else n for n in names)
    raise missing(what, files, seen, how_to_get)
