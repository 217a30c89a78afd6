"""The seed's random streams for a fleet's draws, one per kind of draw.

Two sorts: NumPy generators (:func:`seed_stream`) for what is drawn once per
device when the fleet is built, and counter-based hashes
(:func:`splitmix64`) for what is asked of a device at a time or in a round,
in any order. Imports numpy only.
"""

from __future__ import annotations

import numpy as np

# Tags that separate the random streams derived from one scenario seed: each
# kind of draw has its own stream, so adding a draw of one kind (or a group)
# never shifts the draws of another.
TAG_SPEED = 0xF1EE7
TAG_TIER = 0x71E5
TAG_NETWORK = 0x9E7
TAG_AVAILABILITY = 0xA7A11AB1E
# A device's behaviour in a synchronous round (common random numbers): the
# uniforms of device i in round t hash (seed, tag, i, t, slot).
TAG_ROUND = 0x5D1CE
_MASK64 = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised; uint64 arithmetic wraps by design.

    The availability kernel is counter-based: the uniform of device i's
    interval k is a hash of (seed, i, k), not the n-th output of a stream.
    Every interval of every device can then be drawn directly, in any order and
    any grouping of devices, with the same bits: what makes ``online(t)``
    cheap, resumable and independent of which devices were asked before.
    """
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, tag: int) -> int:
    """The hash key of one kind of counter-based draw of the seed: kinds
    with different tags never share a uniform."""
    mixed_seed = splitmix64(np.array([seed & _MASK64], dtype=np.uint64))
    return int(splitmix64(mixed_seed ^ np.uint64(tag))[0])


def unit_uniform(bits: np.ndarray) -> np.ndarray:
    """Top 53 bits of a hash as a float in the open interval (0, 1).

    The half-step offset keeps 0 out, so ``-log(u)`` is always finite.
    """
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def seed_stream(seed: int, tag: int) -> np.random.Generator:
    """The seed's stream for one kind of draw (see the ``TAG_*`` values)."""
    return np.random.default_rng(np.random.SeedSequence([seed, tag]))
