"""Checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is a directory ``ckpt-<round>/`` inside the run directory:

- ``server.pt``: the server state (a dict of tensors), saved with
  ``torch.save`` and read back with ``torch.load(weights_only=True)``, so
  loading never unpickles arbitrary objects;
- ``store-<key>.npy`` and ``store-seen.npy``: the per-client state, read with
  ``np.load(allow_pickle=False)``;
- ``meta.json``: the next round, the simulated time, the selector state and
  how many result rows belong to the checkpoint.

``LATEST`` (written atomically, after the directory is complete) names the
newest checkpoint; older ones are then deleted. Randomness needs no saving:
every random stream is derived from (seed, round, ...) and fleet availability
is a pure function of simulated time.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.results import atomic_write_bytes

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "checkpoint_bytes",
    "latest_checkpoint",
    "save_tensors",
    "load_tensors",
    "write_meta",
    "commit_checkpoint",
    "checkpoint_dir",
    "save_arrays",
    "load_arrays",
]

LATEST = "LATEST"


class CheckpointError(RuntimeError):
    """A run directory has no usable checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
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
    """A lower bound on the disk a checkpoint takes, and while the next one is
    written (before the older is deleted) twice that.

    The server state holds at least the model; a stateful algorithm keeps at
    least one model-sized vector per client (SCAFFOLD's c_i, FedDyn's
    gradient). Asynchronous runs also save the versions in flight, which
    this bound leaves out.

    Example:
        >>> round(checkpoint_bytes(101_770, 4, 10_000, stateful=True) / 2**30, 3)
        7.583
    """
    vectors = 1 + (num_clients if stateful else 0)
    return 2 * vectors * num_params * elem_bytes


def checkpoint_dir(run_dir: Path, next_round: int) -> Path:
    return Path(run_dir) / f"ckpt-{next_round:08d}"


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    import io

    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().clone() for k, v in tensors.items()}, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    out = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(out, dict) or not all(
        isinstance(v, torch.Tensor) for v in out.values()
    ):
        raise CheckpointError(f"{path}: not a dict of tensors")
    return out


def write_meta(ckpt: Path, meta: dict[str, Any]) -> None:
    atomic_write_bytes(ckpt / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())


def commit_checkpoint(run_dir: Path, ckpt: Path) -> None:
    """Point LATEST at ``ckpt`` (atomically) and delete older checkpoints."""
    run_dir = Path(run_dir)
    atomic_write_bytes(run_dir / LATEST, (ckpt.name + "\n").encode())
    for old in run_dir.glob("ckpt-*"):
        if old.name != ckpt.name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    run_dir = Path(run_dir)
    pointer = run_dir / LATEST
    if not pointer.exists():
        raise CheckpointError(
            f"{run_dir}: no checkpoint to resume from ({pointer} is missing; "
            "checkpoints are written every checkpoint.every_rounds rounds)"
        )
    path = run_dir / pointer.read_text().strip()
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
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from None


def save_arrays(ckpt: Path, arrays: dict[str, np.ndarray]) -> None:
    import io

    for key, arr in arrays.items():
        buf = io.BytesIO()
        np.save(buf, np.asarray(arr), allow_pickle=False)
        atomic_write_bytes(ckpt / f"store-{key}.npy", buf.getvalue())


def load_arrays(ckpt: Path) -> dict[str, np.ndarray]:
    return {
        p.name[len("store-") : -len(".npy")]: np.load(p, allow_pickle=False)
        for p in sorted(Path(ckpt).glob("store-*.npy"))
    }
