"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is a folder ``ckpt-<round>/`` (``server.pt``, ``store-*.npy``,
``meta.json``, ``fingerprint.json``) named by ``LATEST``; nothing is loaded
by unpickling. docs/architecture.md ("Checkpoints") describes the format.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedsim.errors import LoadError
from fedsim.results import UnreadableResults, atomic_write_bytes, read_rows

if TYPE_CHECKING:  # torch is imported where tensors are saved or loaded
    import torch


class Resolvable(Protocol):
    """Something that dumps to the resolved scenario as JSON (a loaded
    scenario): what a fingerprint is made from, without this module
    reading the scenario's sections."""

    def model_dump(self, *, mode: str) -> dict[str, Any]:
        """The resolved fields, JSON-able with ``mode="json"``."""


# A fingerprint: the resolved scenario's JSON, less what cannot change results.
Fingerprint = Mapping[str, object]

LATEST = "LATEST"
FINGERPRINT = "fingerprint.json"
_CKPT_NAME = re.compile(r"ckpt-[0-9]{1,20}")
_MAX_POINTER_BYTES = 256


class CheckpointError(LoadError, RuntimeError):
    """A run directory has no usable checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
    """What meta.json says about a checkpoint: the round (or version) to
    continue with, the simulated time then, the selector's state, and how
    many rows of each result table belong to the run up to it (rows after
    them were written after the checkpoint and are dropped on resume)."""

    path: Path
    next_round: int
    sim_time: float
    selector_state: dict[str, Any]
    n_rows: int
    n_client_rows: int
    n_selector_rows: int = 0


def checkpoint_bytes(
    num_params: int, elem_bytes: int, num_clients: int, stateful: bool
) -> int:
    """A lower bound on the disk two checkpoints take (the next is written
    before the older is deleted): the model, plus one model-sized vector per
    client for a stateful algorithm (versions in flight are left out).

    Example:
        >>> round(checkpoint_bytes(101_770, 4, 10_000, stateful=True) / 2**30, 3)
        7.583
    """
    vectors = 1 + (num_clients if stateful else 0)
    return 2 * vectors * num_params * elem_bytes


def checkpoint_dir(run_dir: Path, next_round: int) -> Path:
    """The folder of the checkpoint after ``next_round`` rounds; zero-padded
    so that the folders sort in round order."""
    return Path(run_dir) / f"ckpt-{next_round:08d}"


# Which values a server state may hold besides tensors, and how each is kept
# exactly: Python ints, floats and bools go into the file as they are (torch's
# weights_only loader reads them); a NumPy array or scalar goes in as a tensor
# of the same dtype and bits, named in this reserved entry so that it comes
# back as NumPy. A checkpoint of tensors only is written as before.
_NUMPY_KEYS = "__fedsim_numpy__"
STATE_TYPES = (
    "torch tensors, Python int, float and bool, and NumPy arrays and scalars "
    "of a bool, integer or floating dtype"
)


def save_tensors(path: Path, tensors: Mapping[str, object]) -> None:
    """Write a server state (tensors copied to the CPU, detached)
    atomically: a checkpoint written on a GPU resumes on a machine without
    one. Besides tensors, a state may hold ints, floats, bools and NumPy
    arrays (an optimizer's step counter, a moment kept in NumPy); each is
    read back by :func:`load_tensors` with its type, dtype and bits.

    Raises:
        CheckpointError: a value of another type (a string, a list, None),
            or a NumPy dtype torch cannot hold; the message names the key
            and the types a state may hold.
    """
    import torch

    out: dict[str, object] = {}
    numpy: dict[str, str] = {}
    for key, value in tensors.items():
        if (problem := state_value_problem(key, value)) is not None:
            raise CheckpointError(f"server state {problem}")
        if torch.is_tensor(value):
            out[key] = value.detach().cpu().clone()
        elif isinstance(value, np.ndarray | np.generic):
            out[key] = _numpy_tensor(key, value)
            numpy[key] = "array" if isinstance(value, np.ndarray) else "scalar"
        else:  # an int, float or bool (not a subclass): kept exactly
            out[key] = value
    if numpy:
        out[_NUMPY_KEYS] = numpy
    buf = io.BytesIO()
    try:
        torch.save(out, buf)
    except RuntimeError as exc:
        # torch's writer words a refused allocation as a failed write
        # ("unexpected pos"), the MemoryError only in its context
        if not _refused_memory(exc):
            raise
        raise MemoryError(f"no memory left to write {path}") from exc
    atomic_write_bytes(path, buf.getvalue())


def _refused_memory(exc: BaseException) -> bool:
    """Whether a MemoryError is among ``exc``'s causes and contexts."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, MemoryError):
            return True
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return False


def state_value_problem(key: str, value: object) -> str | None:
    """Why a server state's ``value`` at ``key`` cannot be checkpointed
    exactly (its type, as "key 'k' holds a str, ..."), or None when it can:
    the test :func:`save_tensors` applies, for a check at the first
    aggregate rather than at the first checkpoint (NumPy dtypes are
    checked when written)."""
    import torch

    if key == _NUMPY_KEYS:
        return f"key {key!r} is reserved by fedsim"
    if torch.is_tensor(value) or isinstance(value, np.ndarray | np.generic):
        return None
    if type(value) in (int, float, bool):
        return None
    return (
        f"key {key!r} holds a {type(value).__qualname__}, which a checkpoint "
        f"cannot keep exactly; a state holds {STATE_TYPES}"
    )


def _numpy_tensor(key: str, value: np.ndarray | np.generic) -> torch.Tensor:
    """A NumPy array or scalar as a tensor of the same dtype and bits (a
    copy), or a CheckpointError naming ``key`` for a dtype torch lacks."""
    import torch

    arr = np.array(value, copy=True)  # a 0-d array for a scalar
    if arr.dtype.kind not in "biuf":
        raise CheckpointError(
            f"server state key {key!r} holds a NumPy {arr.dtype} value; a state "
            f"holds {STATE_TYPES}"
        )
    try:
        return torch.from_numpy(arr)
    except TypeError as exc:  # a dtype torch has no tensor of (uint16 on old torch)
        raise CheckpointError(
            f"server state key {key!r}: NumPy {arr.dtype} cannot be kept ({exc}); "
            f"a state holds {STATE_TYPES}"
        ) from None


def load_tensors(path: Path) -> dict[str, Any]:
    """Read a state written by :func:`save_tensors`, with torch's
    ``weights_only`` loader: a checkpoint is data, never code to run.

    Returns:
        Each key with what was saved: a tensor, an int, float or bool, or a
        NumPy array or scalar of the saved dtype.

    Raises:
        CheckpointError: the file holds anything but such a dict.
    """
    import torch

    out = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(out, dict):
        raise CheckpointError(f"{path}: not a dict of tensors")
    numpy = out.pop(_NUMPY_KEYS, {})
    plain = (int, float, bool)
    if (
        not isinstance(numpy, dict)
        or any(not (torch.is_tensor(v) or type(v) in plain) for v in out.values())
        or any(
            not (torch.is_tensor(out.get(k)) and w in ("array", "scalar"))
            for k, w in numpy.items()
        )
    ):
        raise CheckpointError(f"{path}: not a dict of tensors")
    for key, kind in numpy.items():
        arr = out[key].numpy().copy()
        out[key] = arr if kind == "array" else arr[()]
    return out


def write_meta(ckpt: Path, meta: Mapping[str, object]) -> None:
    """Write the checkpoint's meta.json (see :class:`Checkpoint`) atomically."""
    atomic_write_bytes(ckpt / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())


def commit_checkpoint(run_dir: Path, ckpt: Path) -> None:
    """Point LATEST at ``ckpt`` (atomically) and delete older checkpoints.

    The order is what makes a checkpoint safe against a kill at any moment:
    ``ckpt`` is complete before LATEST names it, and the older one is
    deleted only after, so LATEST always names a whole checkpoint.
    """
    run_dir = Path(run_dir)
    if not _CKPT_NAME.fullmatch(ckpt.name):
        raise CheckpointError(f"{ckpt}: not a ckpt-<round> folder name")
    atomic_write_bytes(run_dir / LATEST, (ckpt.name + "\n").encode())
    for old in run_dir.glob("ckpt-*"):
        if old.name != ckpt.name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def _read_pointer(run_dir: Path) -> Path:
    """The checkpoint folder LATEST names, refused unless it is a ``ckpt-*``
    folder directly inside ``run_dir`` (never read or delete other files)."""
    pointer = run_dir / LATEST
    try:
        with pointer.open("rb") as f:
            raw = f.read(_MAX_POINTER_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(
            f"{run_dir}: no checkpoint to resume from ({pointer} is missing; "
            "checkpoints are written every checkpoint.every_rounds rounds)"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{pointer}: cannot read ({exc.strerror})") from None
    name = raw.decode("ascii").strip() if raw.isascii() else ""
    if not name or len(raw) > _MAX_POINTER_BYTES or not name.isprintable():
        shown = "it is empty" if not raw.strip() else "not a checkpoint name"
        raise CheckpointError(
            f"{pointer}: damaged ({shown}); it should hold one line such as "
            "ckpt-00000010 naming a folder in the run directory"
        )
    if not _CKPT_NAME.fullmatch(name):
        raise CheckpointError(
            f"{pointer}: names {name[:80]!r}, not a ckpt-<round> folder directly "
            "inside the run directory; refusing to follow it"
        )
    path = run_dir / name
    try:
        inside = path.resolve().parent == run_dir.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise CheckpointError(
            f"{pointer}: {name} leads outside the run directory {run_dir} "
            "(a symlink?); refusing to follow it"
        )
    return path


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    """The checkpoint LATEST names; CheckpointError when LATEST is missing,
    damaged or points outside ``run_dir``, or ``meta.json`` is unreadable."""
    path = _read_pointer(Path(run_dir))
    try:
        meta = json.loads((path / "meta.json").read_text())
        return Checkpoint(
            path=path,
            next_round=int(meta["next_round"]),
            sim_time=float(meta["sim_time"]),
            selector_state=dict(meta.get("selector_state", {})),
            n_rows=int(meta["n_rows"]),
            n_client_rows=int(meta["n_client_rows"]),
            n_selector_rows=int(meta.get("n_selector_rows", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from None


def check_resumable(run_dir: Path) -> Checkpoint:
    """Everything a resume of ``run_dir`` reads, read once before anything is
    written: LATEST, the checkpoint's meta.json, server state, client store
    and the parameters of versions in flight, and the rows of the result
    tables the checkpoint counts. A resume that would fail half-way (after
    the run has started rewriting its tables) fails here instead, with every
    file as it was.

    Returns:
        The checkpoint LATEST names.

    Raises:
        CheckpointError: naming the first file that is missing, damaged or
            shorter than the checkpoint says.
    """
    run_dir = Path(run_dir)
    ck = latest_checkpoint(run_dir)
    try:
        meta = json.loads((ck.path / "meta.json").read_text())
        payloads = [int(v) for v in meta.get("payload_versions", [])]
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{ck.path / 'meta.json'}: unreadable ({exc})") from None
    needed = [ck.path / "server.pt"]
    needed += [ck.path / f"payload-{v:08d}.pt" for v in payloads]
    for path in needed:
        _check_tensors(path)
    try:
        load_arrays(ck.path)
    except (OSError, ValueError, EOFError) as exc:
        raise CheckpointError(f"{ck.path}: damaged client store ({exc})") from None
    tables = [("rounds", ck.n_rows), ("clients", ck.n_client_rows)]
    if ck.n_selector_rows:
        tables.append(("selector", ck.n_selector_rows))
    for name, rows in tables:
        try:
            read_rows(run_dir / f"{name}.parquet", rows)
        except UnreadableResults as exc:
            raise CheckpointError(f"{exc}; cannot resume") from None
    return ck


def _check_tensors(path: Path) -> None:
    """Raise CheckpointError naming ``path`` unless it loads as tensors."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; cannot resume")
    try:
        load_tensors(path)
    except CheckpointError:
        raise
    except Exception as exc:  # torch reports a cut file as several kinds
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: damaged ({why}); cannot resume") from None


# Fields that cannot change results (``rounds``: a resume may extend the run);
# gpus_per_worker and vectorize stay: they change floating-point results.
FINGERPRINT_EXCLUDES: tuple[str, ...] = (
    "name",
    "rounds",
    "checkpoint.every_rounds",
    "resources.workers",
    "resources.cpus_per_worker",
    "resources.server",  # where the server runs: same results either way
    "resources.server_node",
    "resources.server_cpus",
    "resources.placement",
    "resources.placement_timeout_s",
    "resources.data",
)


def _file_digest(path: str) -> str:
    """sha256 of a file's bytes ("missing" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return "missing"


def fingerprint(scenario: Resolvable) -> dict[str, Any]:
    """The resolved scenario as JSON minus :data:`FINGERPRINT_EXCLUDES`; a
    trace file is recorded by its name and the sha256 of its content.

    Args:
        scenario: the loaded scenario (only its JSON dump is read).

    Example:
        >>> from fedsim.scenario import load_scenario
        >>> fp = fingerprint(load_scenario("scenarios/quickstart.yaml"))
        >>> "rounds" in fp, fp["client"]["lr"]
        (False, 0.05)
    """
    out = scenario.model_dump(mode="json")
    for dotted in FINGERPRINT_EXCLUDES:
        *parents, last = dotted.split(".")
        reduce(lambda node, key: node.get(key, {}), parents, out).pop(last, None)
    for group in out.get("fleet", {}).get("groups", []):
        trace = group.get("trace") if isinstance(group, dict) else None
        if isinstance(trace, dict) and isinstance(trace.get("file"), str):
            trace["sha256"] = _file_digest(trace["file"])
            trace["file"] = Path(trace["file"]).name
    return out


def write_fingerprint(ckpt: Path, fp: Fingerprint) -> None:
    """Store a run's fingerprint in ``ckpt`` (before committing it).

    Args:
        ckpt: the checkpoint folder.
        fp: :func:`fingerprint` of the run's scenario, made once at set-up.
    """
    text = json.dumps(fp, indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(Path(ckpt) / FINGERPRINT, text.encode())


def _flatten(obj: object, prefix: str = "") -> dict[str, object]:
    """Nested JSON as ``{"a.b[0].c": leaf}``, so that a fingerprint mismatch
    names each differing field by the path a ``--set`` would use."""
    items: list[tuple[str, object]]
    if isinstance(obj, dict):
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(obj)]
    else:
        return {prefix: obj}
    out = {p: leaf for key, v in items for p, leaf in _flatten(v, key).items()}
    return out or {prefix: type(obj)()}


def check_fingerprint(
    ckpt_path: Path, scenario: Resolvable, missing_ok: bool = False
) -> None:
    """Refuse to resume ``ckpt_path`` (a checkpoint folder, or a run folder
    whose LATEST is followed) with a scenario of another experiment: a
    CheckpointError lists every differing field, with both values.
    ``missing_ok`` accepts a checkpoint without ``fingerprint.json``."""
    ckpt = Path(ckpt_path)
    if (ckpt / LATEST).exists():
        ckpt = _read_pointer(ckpt)
    path = ckpt / FINGERPRINT
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if missing_ok:
            return
        raise CheckpointError(
            f"{path}: missing; cannot tell whether the checkpoint belongs to "
            "this scenario"
        ) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None
    if not isinstance(stored, dict):
        raise CheckpointError(f"{path}: unreadable (not a JSON object)")
    current = fingerprint(scenario)
    old, new = _flatten(stored), _flatten(current)
    diffs = [
        f"{k}: {_show(old.get(k, _NONE))} (checkpoint) vs "
        f"{_show(new.get(k, _NONE))} (scenario)"
        for k in sorted(set(old) | set(new))
        if old.get(k, _NONE) != new.get(k, _NONE)
        and not (k not in old and _at_default(scenario, k, new[k]))
    ]
    if diffs:
        more = f"; and {len(diffs) - 10} more" if len(diffs) > 10 else ""
        raise CheckpointError(
            f"{ckpt}: the checkpoint is of another experiment; differing "
            f"fields: {'; '.join(diffs[:10])}{more}"
        )


_NONE = object()


def _at_default(scenario: Resolvable, dotted: str, value: object) -> bool:
    """Whether the field at ``dotted`` (a path of :func:`_flatten`) holds its
    class default, ``value`` being its JSON value in the fingerprint.

    A checkpoint written by an earlier fedsim lacks the fields added since
    (``eval.federated_every``, ...); a field left at its default changes
    nothing an earlier version computed, so such a checkpoint still resumes.
    A path through a list (``fleet.groups[0]...``) or to a field without a
    plain default counts as set: the mismatch is reported, as before.
    """
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    *parents, last = dotted.split(".")
    if any("[" in key for key in parents):
        return False
    start: object = scenario
    node = reduce(lambda n, key: getattr(n, key, None), parents, start)
    fields = type(node).model_fields if isinstance(node, BaseModel) else {}
    spec = fields.get(last)
    if spec is None or spec.default is PydanticUndefined:
        return False
    default = spec.default
    if isinstance(default, BaseModel):
        default = default.model_dump(mode="json")
    return bool(default == value)


def _show(v: object) -> str:
    """A fingerprint value for a message: JSON, cut at 60 characters."""
    if v is _NONE:
        return "(absent)"
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def save_arrays(ckpt: Path, arrays: dict[str, np.ndarray]) -> None:
    """The client store's arrays as ``store-<key>.npy`` (no pickles), each
    written atomically."""
    for key, arr in arrays.items():
        buf = io.BytesIO()
        np.save(buf, np.asarray(arr), allow_pickle=False)
        atomic_write_bytes(ckpt / f"store-{key}.npy", buf.getvalue())


def load_arrays(ckpt: Path) -> dict[str, np.ndarray]:
    """Inverse of :func:`save_arrays`; refuses pickled arrays (ValueError)."""
    return {
        p.name[len("store-") : -len(".npy")]: np.load(p, allow_pickle=False)
        for p in sorted(Path(ckpt).glob("store-*.npy"))
    }
