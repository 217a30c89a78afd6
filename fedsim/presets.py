"""Device presets fitted to measurements: FLASH's smartphones and their WiFi.

Source: Chengxu Yang, Qipeng Wang, Mengwei Xu, Zhenpeng Chen, Kaigui Bian,
Yunxin Liu, Xuanzhe Liu. *Characterizing Impacts of Heterogeneity in
Federated Learning upon Large-Scale Smartphone Data.* WWW 2021,
arXiv:2006.06983 ("FLASH"; github.com/PKU-Chengxu/FLASH at commit 55cbede0,
``models/utils/device_util/``, BSD-2-Clause). Each tier is a lognormal fitted
to FLASH's data: docs/fleets.md, "The FLASH phone presets".

Example:
    >>> [round(t.median_steps_per_s, 3) for t in phone_tiers("femnist-cnn")]
    [0.609, 1.701, 5.587]
    >>> [round(t.median_flops_per_s / 1e9, 3) for t in phone_tiers("femnist-cnn")]
    [0.621, 1.735, 5.699]
    >>> round(NETWORK_PRESETS["flash-wifi"].down_median_mbps, 1)
    41.4
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Literal, get_args

import numpy as np

Workload = Literal["femnist-cnn", "celeba-cnn", "reddit-lstm", "shakespeare-lstm"]
WORKLOADS: tuple[str, ...] = get_args(Workload)
TIERS = ("low", "mid", "high")

# FLASH, as published: device_util.py (get_train_time, unknown) and
# supported_devices.json + benchmark2score.json.
FLASH_REFERENCE_PHONES = ("Google Nexus S", "Xiaomi Redmi Note 7 Pro", "Google Pixel 4")
FLASH_REFERENCE_SCORES = (383.0, 6702.0, 33289.0)  # AI-Benchmark AI_Score
FLASH_TIER_WEIGHTS = (18820, 16428, 159)  # phones of the trace per tier
# Measured mean training time per mini-batch, ms, per tier (shakespeare: batch 100)
FLASH_TRAIN_MS: dict[str, tuple[float, float, float]] = {
    "femnist-cnn": (1642.0, 588.0, 179.0),
    "celeba-cnn": (5392.0, 1355.0, 561.0),
    "reddit-lstm": (2596.0, 916.0, 527.7),
    "shakespeare-lstm": (28621.0, 13579.0, 10681.0),
}
# The minibatch those times are for: FLASH's default batch_size (10,
# models/default.cfg), 100 for Shakespeare (the comment beside its times)
FLASH_BATCH_SIZE = {
    "femnist-cnn": 10,
    "celeba-cnn": 10,
    "reddit-lstm": 10,
    "shakespeare-lstm": 100,
}
# FLOPs of one training step of each workload's model (LEAF's, as FLASH ran
# it) at that batch size, counted as fedsim counts any model
# (fedsim.flops.flash_workload_flops; tests/test_flops.py recounts them)
FLASH_STEP_FLOPS = {
    "femnist-cnn": 1_020_170_240,
    "celeba-cnn": 1_530_178_560,
    "reddit-lstm": 2_154_659_840,
    "shakespeare-lstm": 38_049_382_400,
}

# Fitted by fit_flash: sd of log AI_Score of the benchmark phones in each tier
FLASH_LOG_SCORE_SD = (0.7349, 0.4806, 0.2909)
FLASH_TIER_PHONES = (121, 125, 61)
# slope of log(speed) on log(score) over the three reference phones
FLASH_ELASTICITY: dict[str, float] = {
    "femnist-cnn": 0.4802,
    "celeba-cnn": 0.5040,
    "reddit-lstm": 0.3577,
    "shakespeare-lstm": 0.2254,
}
# WiFi across 19 users: lognormal medians (Mbit/s), sigmas, log-correlation
FLASH_WIFI = {
    "down_median_mbps": 41.373,
    "down_sigma": 0.4840,
    "up_median_mbps": 24.821,
    "up_sigma": 0.7011,
    "rho": 0.4477,
}


@dataclasses.dataclass(frozen=True)
class SpeedTier:
    """One lognormal tier of a speed preset: ``median * exp(sigma * z)``;
    ``step_flops`` are the FLOPs of one step of the workload it was
    measured on, which give the tier's FLOP/s."""

    name: str
    share: float
    median_steps_per_s: float
    sigma: float
    step_flops: float

    @property
    def median_flops_per_s(self) -> float:
        """The tier's median in FLOP/s: its measured steps/s times the
        FLOPs of one step of its workload (docs/fleets.md, "Speed in
        FLOP/s")."""
        return self.median_steps_per_s * self.step_flops


@dataclasses.dataclass(frozen=True)
class NetworkPreset:
    """Per-device lognormal links: ``down = median * exp(down_sigma * z1)``,
    ``up = median * exp(up_sigma * (rho z1 + sqrt(1 - rho^2) z2))``."""

    down_median_mbps: float
    down_sigma: float
    up_median_mbps: float
    up_sigma: float
    rho: float


def phone_tiers(workload: str = "femnist-cnn") -> tuple[SpeedTier, ...]:
    """FLASH's three phone tiers for ``workload``, with their trace shares."""
    if workload not in FLASH_TRAIN_MS:
        raise ValueError(f"unknown workload {workload!r}; one of {WORKLOADS}")
    total, b = sum(FLASH_TIER_WEIGHTS), FLASH_ELASTICITY[workload]
    flops = float(FLASH_STEP_FLOPS[workload])
    columns = (TIERS, FLASH_TIER_WEIGHTS, FLASH_TRAIN_MS[workload], FLASH_LOG_SCORE_SD)
    return tuple(
        SpeedTier(name, n / total, 1000.0 / ms, round(b * sd, 4), flops)
        for name, n, ms, sd in zip(*columns, strict=True)
    )


SPEED_PRESETS = ("flash-phones", *(f"flash-phones-{tier}" for tier in TIERS))


def speed_preset(
    name: str, workload: str = "femnist-cnn", scale: float = 1.0
) -> tuple[SpeedTier, ...]:
    """The tiers of a speed preset, medians multiplied by ``scale``.

    ``flash-phones`` is the tier mix; ``flash-phones-<tier>`` one tier (share 1).

    >>> [t.name for t in speed_preset("flash-phones")]
    ['low', 'mid', 'high']
    >>> t, = speed_preset("flash-phones-high", scale=2.0)
    >>> round(t.median_steps_per_s, 2), t.share, round(t.median_flops_per_s / 1e9, 2)
    (11.17, 1.0, 11.4)
    """
    if name not in SPEED_PRESETS:
        raise ValueError(f"unknown speed preset {name!r}; one of {SPEED_PRESETS}")
    tiers = phone_tiers(workload)
    if name != "flash-phones":
        tiers = tuple(
            dataclasses.replace(t, share=1.0) for t in tiers if name.endswith(t.name)
        )
    return tuple(
        dataclasses.replace(t, median_steps_per_s=t.median_steps_per_s * scale)
        for t in tiers
    )


NETWORK_PRESETS: dict[str, NetworkPreset] = {"flash-wifi": NetworkPreset(**FLASH_WIFI)}


def fit_flash(data_dir: str | Path) -> dict[str, object]:
    """Recompute the fitted figures from FLASH's data files.

    Args:
        data_dir: a folder with ``benchmark2score.json``,
            ``supported_devices.json`` and ``speed_distri.json`` (FLASH's
            ``models/utils/device_util/`` and ``data/``).

    Returns:
        ``reference_scores``, ``tier_phones``, ``log_score_sd`` (per tier),
        ``elasticity`` (per workload) and ``wifi`` (as ``FLASH_WIFI``).
    """
    d = Path(data_dir)
    scores = json.loads((d / "benchmark2score.json").read_text())
    phones = json.loads((d / "supported_devices.json").read_text())
    ref = np.array([float(scores[p]) for p in phones])
    s = np.array([float(v) for v in scores.values()])
    # FLASH's Device_Util.transfer: the reference phone of the nearest score
    tier = np.argmin(np.abs(s[:, None] - ref[None, :]), axis=1)
    log_sd = tuple(float(np.std(np.log(s[tier == t]), ddof=1)) for t in range(3))
    x = np.log(ref) - np.log(ref).mean()
    logs = {w: np.log(1000.0 / np.array(ms)) for w, ms in FLASH_TRAIN_MS.items()}
    elasticity = {w: float(x @ (y - y.mean()) / (x @ x)) for w, y in logs.items()}
    net = json.loads((d / "speed_distri.json").read_text())
    kb_to_mbps = 8.0 / 1000.0  # KB/s (1 KB = 1000 bytes) -> Mbit/s
    down = np.log([u["down_u"] * kb_to_mbps for u in net.values()])
    up = np.log([u["up_u"] * kb_to_mbps for u in net.values()])
    return {
        "reference_scores": tuple(float(r) for r in ref),
        "tier_phones": tuple(int((tier == t).sum()) for t in range(3)),
        "log_score_sd": log_sd,
        "elasticity": elasticity,
        "wifi": {
            "down_median_mbps": math.exp(down.mean()),
            "down_sigma": float(down.std(ddof=1)),
            "up_median_mbps": math.exp(up.mean()),
            "up_sigma": float(up.std(ddof=1)),
            "rho": float(np.corrcoef(down, up)[0, 1]),
        },
    }
