"""Per-client persistent state (SCAFFOLD's c_i, FedDyn's h_i, ...) on the server
side, one array per state key, spilled to disk above ``budget_bytes``.

Example:
    >>> import torch
    >>> st = ClientStore(num_clients=3, dim=2)
    >>> st.put(1, {"c": torch.tensor([1.0, 2.0])})
    >>> st.get([0, 1])
    {0: {}, 1: {'c': tensor([1., 2.])}}
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

DEFAULT_BUDGET = 4 * 1024**3


class ClientStore:
    """Dense per-key arrays of client state, in RAM or spilled to disk."""

    def __init__(
        self,
        num_clients: int,
        dim: int,
        dtype: torch.dtype = torch.float32,
        budget_bytes: int = DEFAULT_BUDGET,
        spill_dir: str | Path | None = None,
    ) -> None:
        self.num_clients = num_clients
        self.dim = dim
        self.np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        self.budget_bytes = budget_bytes
        self._spill = spill_dir
        self._tmp: str | None = None
        self.arrays: dict[str, np.ndarray] = {}
        self.seen = np.zeros(num_clients, dtype=bool)

    def _array(self, key: str) -> np.ndarray:
        if key in self.arrays:
            return self.arrays[key]
        shape = (self.num_clients, self.dim)
        total = math.prod(shape) * self.np_dtype.itemsize * (len(self.arrays) + 1)
        if total <= self.budget_bytes:
            arr = np.zeros(shape, dtype=self.np_dtype)
        else:  # spilled to disk
            if self._tmp is None:
                self._tmp = tempfile.mkdtemp(prefix="fedsim-store-", dir=self._spill)
            path = Path(self._tmp) / f"{key}.npy"
            arr = np.lib.format.open_memmap(path, "w+", self.np_dtype, shape)
        self.arrays[key] = arr
        return arr

    def get(self, clients: Iterable[int]) -> dict[int, dict[str, torch.Tensor]]:
        """Copies of the clients' states ({} for a client that never trained)."""
        out: dict[int, dict[str, torch.Tensor]] = {}
        for c in map(int, clients):
            arrays = self.arrays.items() if self.seen[c] else ()
            out[c] = {k: torch.from_numpy(np.array(a[c])) for k, a in arrays}
        return out

    def put(self, client: int, state: dict[str, torch.Tensor]) -> None:
        """Store ``client``'s new persistent state (copied to the CPU, in the
        store's dtype); keys it does not name keep their old values."""
        for key, value in state.items():
            self._array(key)[client] = value.detach().cpu().numpy()
        self.seen[client] = True

    def export(self) -> dict[str, np.ndarray]:
        """Every array (and ``seen``), for a checkpoint."""
        return {"seen": self.seen, **self.arrays}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`export`."""
        self.arrays.clear()
        self.seen = np.array(arrays.get("seen", np.zeros(self.num_clients, bool)))
        for key, arr in arrays.items():
            if key != "seen":
                self._array(key)[:] = arr

    def close(self) -> None:
        """Drop every array and delete the spill folder, if one was made."""
        self.arrays.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __del__(self) -> None:  # best effort: never leave spill files behind
        with contextlib.suppress(Exception):
            self.close()
