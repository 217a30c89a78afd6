"""Device presets fitted to measurements: FLASH's smartphones and their WiFi.

Source: Chengxu Yang, Qipeng Wang, Mengwei Xu, Zhenpeng Chen, Kaigui Bian,
Yunxin Liu, Xuanzhe Liu. *Characterizing Impacts of Heterogeneity in
Federated Learning upon Large-Scale Smartphone Data.* WWW 2021,
arXiv:2006.06983 ("FLASH"; a trace of 136k smartphones). Code and data:
github.com/PKU-Chengxu/FLASH at commit 55cbede0, files under
``models/utils/device_util/`` (BSD-2-Clause). The phone scores are the
AI-Benchmark ranking (Ignatov et al., ai-benchmark.com) as scraped by the
FLASH authors. fedsim ships the fitted figures below, not the data files;
:func:`fit_flash` recomputes them from a copy of the data, and
``tests/test_fleet_realistic.py`` checks that they match.

**How FLASH models phones.** FLASH measured on-device training on three
phones, one per tier: Google Nexus S (low), Xiaomi Redmi Note 7 Pro (mid) and
Google Pixel 4 (high), with AI-Benchmark scores 383, 6702 and 33289. A phone
of the trace goes to the tier whose reference phone has the nearest score
(``Device_Util.transfer``); a phone of unknown model goes to a tier with
weights 18820 : 16428 : 159 (``Device_Util.unknown``: the mix of the known
phones of the trace), i.e. 53.15% / 46.40% / 0.45%. Its time per mini-batch is
drawn around the reference phone's measured mean:

==================== ============== ============= ============
ms per mini-batch    low (Nexus S)  mid (Note 7)  high (Pixel 4)
==================== ============== ============= ============
FEMNIST CNN          1642 +- 99.5   588 +- 23.9   179 +- 2.3
CelebA CNN           5392 +- 982.5  1355 +- 54.6  561 +- 20.3
Reddit LSTM          2596 +- 335.5  916 +- 20.6   527.7 +- 49.0
Shakespeare LSTM*    28621 +- 1720.7 13579 +- 104.6 10681 +- 125.6
==================== ============== ============= ============

(*) batch 100. FLASH gives every phone of a tier the same speed.

**What fedsim fits.** Each tier is a lognormal speed distribution:

- *median*: the reference phone's measured speed, ``1000 / ms`` steps per
  second (as in FLASH);
- *sigma*: the hardware spread inside the tier, which FLASH leaves out. The
  307 phones of ``benchmark2score.json`` are put in tiers by FLASH's
  nearest-score rule (121 low, 125 mid, 61 high); the standard deviation of
  log score inside each tier is 0.735, 0.481 and 0.291. Training speed is not
  proportional to the score: across the three reference phones, log speed
  grows like ``b * log score`` with ``b`` (least squares, per workload) 0.480
  for FEMNIST CNN, 0.504 CelebA CNN, 0.358 Reddit LSTM and 0.225 Shakespeare
  LSTM. So the tier's sigma is ``b * sd(log score)``: for FEMNIST CNN 0.353,
  0.231 and 0.140;
- *shares*: FLASH's tier weights (above).

The measured per-batch noise (e.g. 6% for the Nexus S) is small next to
these spreads and is left out; per-round slowdowns belong to the straggler
model (``stragglers``).

**WiFi.** ``speed_distri.json`` holds 19 users' measured mean download and
upload speeds (KB/s per FLASH's code; here 1 KB = 1000 bytes). Across users
they are lognormal with median 41.4 Mbit/s down (sigma 0.484) and 24.8 Mbit/s
up (sigma 0.701), log-correlation 0.448. FLASH also varies each transfer
around the user's mean; fedsim keeps one speed per device.

Use in a scenario::

    speed: {preset: flash-phones-mid}                      # one tier
    speed: {preset: flash-phones, workload: celeba-cnn}    # the FLASH tier mix
    network: {preset: flash-wifi, latency_s: 0.05}

Example:
    >>> [round(t.median_steps_per_s, 3) for t in phone_tiers("femnist-cnn")]
    [0.609, 1.701, 5.587]
    >>> round(NETWORK_PRESETS["flash-wifi"].down_median_mbps, 1)
    41.4
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

__all__ = [
    "FLASH_REFERENCE_SCORES",
    "FLASH_TIER_WEIGHTS",
    "FLASH_TRAIN_MS",
    "NETWORK_PRESETS",
    "NetworkPreset",
    "SPEED_PRESETS",
    "SpeedTier",
    "WORKLOADS",
    "Workload",
    "fit_flash",
    "phone_tiers",
    "speed_preset",
]

Workload = Literal["femnist-cnn", "celeba-cnn", "reddit-lstm", "shakespeare-lstm"]
WORKLOADS: tuple[str, ...] = (
    "femnist-cnn",
    "celeba-cnn",
    "reddit-lstm",
    "shakespeare-lstm",
)
TIERS = ("low", "mid", "high")

# ---------------------------------------------------------- FLASH, as published
# models/utils/device_util/device_util.py (get_train_time, unknown) and
# supported_devices.json + benchmark2score.json.
FLASH_REFERENCE_PHONES = ("Google Nexus S", "Xiaomi Redmi Note 7 Pro", "Google Pixel 4")
FLASH_REFERENCE_SCORES = (383.0, 6702.0, 33289.0)  # AI-Benchmark AI_Score
FLASH_TIER_WEIGHTS = (18820, 16428, 159)  # phones of the trace per tier
# Measured training time per mini-batch, ms: mean per tier [low, mid, high].
FLASH_TRAIN_MS: dict[str, tuple[float, float, float]] = {
    "femnist-cnn": (1642.0, 588.0, 179.0),
    "celeba-cnn": (5392.0, 1355.0, 561.0),
    "reddit-lstm": (2596.0, 916.0, 527.7),
    "shakespeare-lstm": (28621.0, 13579.0, 10681.0),
}

# ------------------------------------------------ fitted by fit_flash (see above)
# sd of log AI_Score of the benchmark phones in each tier (121 / 125 / 61 phones)
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


@dataclass(frozen=True)
class SpeedTier:
    """One lognormal tier of a speed preset: ``median * exp(sigma * z)``."""

    name: str
    share: float
    median_steps_per_s: float
    sigma: float


@dataclass(frozen=True)
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
    total = sum(FLASH_TIER_WEIGHTS)
    b = FLASH_ELASTICITY[workload]
    return tuple(
        SpeedTier(
            name=TIERS[i],
            share=FLASH_TIER_WEIGHTS[i] / total,
            median_steps_per_s=1000.0 / FLASH_TRAIN_MS[workload][i],
            sigma=round(b * FLASH_LOG_SCORE_SD[i], 4),
        )
        for i in range(3)
    )


SPEED_PRESETS = (
    "flash-phones",
    "flash-phones-low",
    "flash-phones-mid",
    "flash-phones-high",
)


def speed_preset(
    name: str, workload: str = "femnist-cnn", scale: float = 1.0
) -> tuple[SpeedTier, ...]:
    """The tiers of a speed preset, medians multiplied by ``scale``.

    ``flash-phones`` is the tier mix; ``flash-phones-<tier>`` one tier (share 1).

    >>> [t.name for t in speed_preset("flash-phones")]
    ['low', 'mid', 'high']
    >>> t, = speed_preset("flash-phones-high", scale=2.0)
    >>> round(t.median_steps_per_s, 2), t.share
    (11.17, 1.0)
    """
    if name not in SPEED_PRESETS:
        raise ValueError(f"unknown speed preset {name!r}; one of {SPEED_PRESETS}")
    tiers = phone_tiers(workload)
    if name != "flash-phones":
        tiers = tuple(t for t in tiers if name.endswith("-" + t.name))
        tiers = (
            SpeedTier(tiers[0].name, 1.0, tiers[0].median_steps_per_s, tiers[0].sigma),
        )
    return tuple(
        SpeedTier(t.name, t.share, t.median_steps_per_s * scale, t.sigma) for t in tiers
    )


NETWORK_PRESETS: dict[str, NetworkPreset] = {
    "flash-wifi": NetworkPreset(**FLASH_WIFI),
}


# ------------------------------------------------------------------- the fit
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
    elasticity = {}
    for w, ms in FLASH_TRAIN_MS.items():
        y = np.log(1000.0 / np.array(ms))
        elasticity[w] = float(x @ (y - y.mean()) / (x @ x))
    net = json.loads((d / "speed_distri.json").read_text())
    kb_to_mbps = 8.0 / 1000.0  # KB/s (1 KB = 1000 bytes) -> Mbit/s
    down = np.log([u["down_u"] * kb_to_mbps for u in net.values()])
    up = np.log([u["up_u"] * kb_to_mbps for u in net.values()])
    wifi = {
        "down_median_mbps": math.exp(down.mean()),
        "down_sigma": float(down.std(ddof=1)),
        "up_median_mbps": math.exp(up.mean()),
        "up_sigma": float(up.std(ddof=1)),
        "rho": float(np.corrcoef(down, up)[0, 1]),
    }
    return {
        "reference_scores": tuple(float(r) for r in ref),
        "tier_phones": tuple(int((tier == t).sum()) for t in range(3)),
        "log_score_sd": log_sd,
        "elasticity": elasticity,
        "wifi": wifi,
    }
