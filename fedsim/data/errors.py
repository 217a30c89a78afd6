"""Locating dataset files on disk, and the error raised when they are missing.

fedsim never downloads anything at run time. A dataset is read from a local
*data root*: the spec's ``root`` field when given, else the environment
variable ``FEDSIM_DATA_ROOT``, else ``~/.cache/fedsim/data``. When the files
are not there, :class:`DataMissingError` says where fedsim looked and how to
obtain them. Data that exists but does not fit the scenario raises
:class:`DataError`. The CLI turns both into exit code 2.

Example:
    >>> from pathlib import Path
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

__all__ = [
    "DataMissingError",
    "DataError",
    "ENV_ROOT",
    "DEFAULT_ROOT",
    "data_root",
    "find_dir",
]

ENV_ROOT = "FEDSIM_DATA_ROOT"
DEFAULT_ROOT = Path("~/.cache/fedsim/data")


class DataMissingError(FileNotFoundError):
    """A dataset's files are not on disk. The message names every path looked
    at and how to obtain the data; it is meant for the user, as is."""


class DataError(ValueError):
    """The data cannot be built as the scenario asks (a partition that does
    not fit the data, a role or client count that does not match the fleet,
    a non-numeric feature column); the message is meant for the user."""


def data_root(root: str | None) -> tuple[Path, bool]:
    """The data root to read from, and whether it is the scenario's own
    ``root`` (which may also name the dataset's folder itself; the
    environment variable and the default hold one subfolder per dataset)."""
    if root:
        return Path(root).expanduser(), True
    env = os.environ.get(ENV_ROOT)
    if env:
        return Path(env).expanduser(), False
    return DEFAULT_ROOT.expanduser(), False


def _exists(folder: Path, name: str, gz: bool) -> bool:
    return (folder / name).is_file() or (gz and (folder / f"{name}.gz").is_file())


def find_dir(
    what: str,
    candidates: Sequence[Path],
    names: Sequence[str],
    how_to_get: str,
    gz: bool = True,
) -> Path:
    """The first folder in ``candidates`` that holds every file in ``names``
    (each as is or, if the reader takes it and ``gz``, gzip-compressed as
    ``name.gz``).

    Raises:
        DataMissingError: naming ``what``, every folder looked at, the files
            expected and ``how_to_get``.
    """
    seen: list[Path] = []
    for folder in candidates:
        if folder in seen:
            continue
        seen.append(folder)
        if all(_exists(folder, n, gz) for n in names):
            return folder
    looked = "\n".join(f"  {p}" for p in seen)
    files = ", ".join(f"{n}[.gz]" if gz else n for n in names)
    raise DataMissingError(
        f"{what}: data not found.\n"
        f"Looked for {files} in:\n{looked}\n"
        f"How to get it: {how_to_get}\n"
        f"(fedsim never downloads data; set data.root in the scenario or the "
        f"{ENV_ROOT} environment variable to the folder that holds it.)"
    )
