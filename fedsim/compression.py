"""Compressed updates: what a client uploads, and what it costs on the wire.

A scenario's ``compression`` section names a compressor (``name:``, a
built-in below, an installed entry point of group ``fedsim.compressors``, or
``module:Class``, as algorithms are found: :mod:`fedsim.plugins`). Every
compressor keeps one small contract, the two methods of :class:`Compressor`:

- ``compress(v, gen)``: what the server reconstructs of the update ``v``
  (a dense vector of the same shape and dtype: the simulation aggregates
  what a real server would decode); random choices from ``gen`` only;
- ``wire_bytes(d, elem_bytes)``: the bytes the compressed update of ``d``
  parameters takes on the wire, indices and scales included: the clock
  charges the upload at this size, so upload time, the deadline and tau
  follow (docs/fleets.md, "Compressed updates").

With ``error_feedback: true`` a client compresses its update plus the
residual it kept, and keeps what compression left out (Seide et al. 2014;
Karimireddy et al. 2019, EF-SGD): the residual lives in the server's client
store, so checkpoints and ``--resume`` carry it.

Built-ins: ``top_k`` and ``random_k`` sparsification (``k`` entries, or a
``fraction`` of d), ``qsgd`` stochastic quantisation to ``bits`` bits a
coordinate plus a sign (Alistarh et al. 2017), ``sign`` with the mean
magnitude as its scale (signSGD with a scale, Karimireddy et al. 2019).

Example:
    >>> import torch
    >>> top = TopK(k=2)
    >>> top.compress(torch.tensor([0.1, -3.0, 2.0, 0.5]), torch.Generator())
    tensor([ 0., -3.,  2.,  0.])
    >>> top.wire_bytes(4, elem_bytes=4)     # 2 values and 2 int32 indices
    16
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from fedsim.lazy import torch
from fedsim.spec import Spec

# Bytes of one index into the update: int32 up to 2^31 parameters.
INDEX_BYTES = 4
# Bytes of the seed that regenerates random-k's indices on the server.
SEED_BYTES = 8


class Compressor(Spec):
    """Base of every compressor: the scenario's ``compression`` section.

    A plug-in subclasses it, declares ``name: Literal["<its name>"]`` and its
    fields, and writes :meth:`compress` and :meth:`wire_bytes`; pydantic
    validates its fields when a scenario loads, as a model's are.

    Attributes:
        error_feedback: compress the update plus the client's residual, and
            keep what was left out for the client's next update.
        download: compress the broadcast too: not built, so only ``false``
            is accepted (the download is billed dense; docs/fleets.md).
    """

    name: str = "base"
    error_feedback: bool = False
    download: bool = False

    @field_validator("download")
    @classmethod
    def _dense_download(cls, value: bool) -> bool:
        """Refuse ``download: true`` when the file loads: a compressed
        broadcast needs the model each client last received, which the
        simulation does not keep, and billing it compressed while clients
        train from the exact model would misstate both time and accuracy."""
        if value:
            raise ValueError(
                "compressing the download is not built (the broadcast is sent "
                "and billed dense); remove download or set it to false"
            )
        return value

    # the client store's key of the error-feedback residual
    RESIDUAL: ClassVar[str] = "compression_residual"

    def compress(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """What the server reconstructs of ``v``.

        Args:
            v: a flat update (float, on the CPU or a worker's device).
            gen: a CPU generator seeded by (seed, round, client): draw every
                random choice from it, so any worker gives the same result.

        Returns:
            A dense tensor shaped and typed like ``v``.
        """
        raise NotImplementedError

    def wire_bytes(self, d: int, elem_bytes: int) -> int:
        """Bytes of the compressed update of ``d`` parameters, each value
        ``elem_bytes`` wide uncompressed (indices and scales included)."""
        raise NotImplementedError

    def problem(self, d: int) -> str | None:
        """Why this compressor cannot compress ``d`` parameters (a field
        named, for one error line before training), or None."""
        return None


class _Sparse(Compressor):
    """``k`` entries of d: a number, or a ``fraction`` of d (rounded up)."""

    k: Annotated[int, Field(ge=1)] | None = None
    fraction: Annotated[float, Field(gt=0, le=1)] | None = None

    @model_validator(mode="after")
    def _one_size(self) -> _Sparse:
        """Exactly one of ``k`` and ``fraction``."""
        if (self.k is None) == (self.fraction is None):
            raise ValueError("give k or fraction (one of them)")
        return self

    def k_of(self, d: int) -> int:
        """The entries kept of ``d``: ``k``, or ceil(fraction d)."""
        if self.k is not None:
            return self.k
        assert self.fraction is not None  # _one_size
        return max(1, math.ceil(round(self.fraction * d, 9)))

    def problem(self, d: int) -> str | None:
        if self.k is not None and self.k > d:
            return (
                f"compression.k: {self.k} is larger than the model ({d:,} parameters)"
            )
        return None

    def _keep(self, v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``v`` at ``idx``, zero elsewhere."""
        out = torch.zeros_like(v)
        out[idx] = v[idx]
        return out


class TopK(_Sparse):
    """The ``k`` entries of largest magnitude, with their int32 indices."""

    name: Literal["top_k"] = "top_k"

    def compress(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        k = self.k_of(v.numel())
        return self._keep(v, top_k_indices(v.abs(), k))

    def wire_bytes(self, d: int, elem_bytes: int) -> int:
        return self.k_of(d) * (elem_bytes + INDEX_BYTES)


class RandomK(_Sparse):
    """``k`` entries drawn uniformly without replacement; the server draws
    the same indices from the seed sent with them (no indices sent)."""

    name: Literal["random_k"] = "random_k"

    def compress(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        k = self.k_of(v.numel())
        idx = torch.randperm(v.numel(), generator=gen)[:k].to(v.device)
        return self._keep(v, idx)

    def wire_bytes(self, d: int, elem_bytes: int) -> int:
        return self.k_of(d) * elem_bytes + SEED_BYTES


class QSGD(Compressor):
    """QSGD: each coordinate as sign and one of ``2^bits - 1`` levels of
    |v_i| / ||v||, rounded up or down at random (unbiased), with the norm:
    ``bits + 1`` bits a coordinate and one value."""

    name: Literal["qsgd"] = "qsgd"
    bits: Annotated[int, Field(ge=1, le=16)] = 4

    def compress(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        norm = torch.linalg.vector_norm(v)
        if float(norm) == 0.0:
            return torch.zeros_like(v)
        s = float(2**self.bits - 1)
        u = torch.rand(v.shape, generator=gen, dtype=v.dtype).to(v.device)
        level = torch.floor(v.abs() / norm * s + u)
        return torch.sign(v) * level * (norm / s)

    def wire_bytes(self, d: int, elem_bytes: int) -> int:
        return math.ceil(d * (self.bits + 1) / 8) + elem_bytes


class Sign(Compressor):
    """The signs, and the mean magnitude ||v||_1 / d as their scale: one
    bit a coordinate and one value."""

    name: Literal["sign"] = "sign"

    def compress(self, v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return torch.sign(v) * v.abs().mean()

    def wire_bytes(self, d: int, elem_bytes: int) -> int:
        return math.ceil(d / 8) + elem_bytes


# Below k * 64 <= d, torch.topk on the CPU runs a heap over all d entries
# (std::partial_sort, O(d log k)): 90 ms for 1% of a 1.66M-parameter CNN.
_HEAP = 64
# The fast path samples every _STRIDE-th entry for a threshold below the
# k-th largest, with a margin of _SLACK times the sample's expected count
# plus 4 of its standard deviations: short of k is rare (then: torch.topk).
_STRIDE = 16
_SLACK = 1.2


def top_k_indices(a: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest entries of the flat ``a``: the same
    set ``torch.topk(a, k)`` picks (in another order), faster for small k.

    Where torch.topk is slow (``k * 64 <= d``) the k-th largest comes from
    the few entries above a threshold read off a strided sample (one pass
    over ``a`` to find them). Where that set is not unique (entries tied at
    the k-th value, which torch breaks by its heap's history) or ``a`` has
    NaNs (torch ranks them first), or the threshold turned out too high,
    torch.topk decides: the result is its set in every case.

    Args:
        a: a flat tensor (the magnitudes).
        k: how many to keep, 1 <= k <= ``a.numel()``.

    Returns:
        ``k`` distinct int64 indices.
    """
    d = a.numel()
    # a NaN makes the sum NaN (one cheap pass; a false alarm costs only time)
    if k * _HEAP > d or bool(a.sum().isnan()):
        return torch.topk(a, k, sorted=False).indices
    sample = a[::_STRIDE]
    expect = k / _STRIDE
    rank = min(sample.numel(), math.ceil(_SLACK * expect + 4 * math.sqrt(expect)))
    low = torch.kthvalue(sample, sample.numel() - rank + 1).values
    cand = torch.nonzero(a >= low).flatten()
    if cand.numel() >= k:  # so every entry above the k-th largest is here
        mags = a[cand]
        kth = torch.kthvalue(mags, cand.numel() - k + 1).values
        top = mags >= kth
        if int(top.sum()) == k:  # no tie at the k-th value: one answer
            return cand[top]
    return torch.topk(a, k, sorted=False).indices


REGISTRY: dict[str, type[Compressor]] = {
    "top_k": TopK,
    "random_k": RandomK,
    "qsgd": QSGD,
    "sign": Sign,
}
DEFAULT = None  # a compression section names its compressor


@dataclass(frozen=True)
class Compressed:
    """A client's update as the server gets it, and the residual the client
    keeps (None without error feedback)."""

    delta: torch.Tensor
    residual: torch.Tensor | None


def compress_update(
    comp: Compressor,
    delta: torch.Tensor,
    residual: torch.Tensor | None,
    gen: torch.Generator,
) -> Compressed:
    """Compress one client's ``delta`` (with error feedback: ``delta`` plus
    its ``residual``, None or absent the first time: zero).

    Args:
        comp: the scenario's compressor.
        delta: the client's model change.
        residual: what its earlier compressions left out (error feedback).
        gen: the client's compression generator.

    Returns:
        The reconstructed update and, with error feedback, the new residual
        (``delta + residual - compressed``).
    """
    if not comp.error_feedback:
        return Compressed(comp.compress(delta, gen), None)
    v = delta if residual is None else delta + residual.to(delta.device, delta.dtype)
    sent = comp.compress(v, gen)
    return Compressed(sent, v - sent)


def upload_bytes(comp: Compressor | None, up: int, d: int, elem_bytes: int) -> int:
    """A client's upload with its model update compressed: ``up`` (the
    algorithm's size, ``up_factor`` vectors of ``d``) less one dense vector,
    plus the compressed one; other vectors (SCAFFOLD's control variate) go
    dense. ``up`` itself without a compressor.

    Example:
        >>> upload_bytes(TopK(k=10), up=2 * 100 * 4, d=100, elem_bytes=4)
        480
    """
    if comp is None:
        return up
    return up - d * elem_bytes + comp.wire_bytes(d, elem_bytes)


# Separates the compression generator's stream from the minibatches' (the
# same (seed, round, client), another tag).
_TAG = 0xC0DEC


def compression_generator(client_seed: int) -> torch.Generator:
    """The CPU generator of one client's compression in one round (or job),
    from the client's minibatch seed and a tag of its own."""
    seed = np.random.SeedSequence([client_seed, _TAG]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(seed))
