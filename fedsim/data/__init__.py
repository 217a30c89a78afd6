"""Federated datasets: who holds which samples.

A :class:`FederatedData` keeps every client's training samples in one array,
sorted by client, so client i owns rows ``offsets[i]:offsets[i+1]``. Workers
receive it once (through the Ray object store, zero-copy for NumPy arrays)
and draw minibatches by index; nothing is pickled per task.
"""

from __future__ import annotations

from fedsim.data.base import FederatedData, build_data

__all__ = ["FederatedData", "build_data"]
