"""The secure-aggregation study of docs/fleets.md ("Secure aggregation: a
study"): how the dropout rate and SecAgg's threshold together decide the
rounds lost and the time to a target accuracy, on
scenarios/secagg-small.yaml (20 phones, 10 chosen a round, 10 s rounds), and
what SecAgg and SecAgg+ cost as the cohort grows.

    nice -n 10 python benchmarks/secagg_study.py [--seeds 3] [--rounds 30]

Prints the table of docs/fleets.md and writes docs/secagg-study.png: (a) the
share of rounds lost against the dropout rate, one line per threshold, with
the binomial expectation P(Bin(10, 1 - p) < t) beside it; (b) the time to
the target accuracy; (c) the cost model alone (no training): a client's
extra upload and the server's unmasking seconds against the cohort size,
SecAgg against SecAgg+, for a 1M-parameter model with 10% dropped.
About three minutes on one core.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from fedsim.clock import Plan, RoundPlan
from fedsim.fleet import Fleet, FleetSpec
from fedsim.rows import Row
from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario
from fedsim.secagg import SecAggModel, SecAggSpec
from fedsim.servertime import SERVER_PRESETS

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "secagg-small.yaml"
COHORT = 10  # the scenario's selector.clients_per_round
DROPOUTS = (0.0, 0.1, 0.2, 0.3, 0.4)
# None: no secure aggregation (the baseline); else the threshold's fraction
THRESHOLDS: tuple[float | None, ...] = (None, 0.5, 0.7, 0.9)


def _run(p: float, threshold: float | None, seed: int, rounds: int) -> list[Row]:
    section = (
        "secure_aggregation=null"
        if threshold is None
        else f"secure_aggregation.threshold={threshold}"
    )
    over = [f"fleet.stragglers.dropout_p={p}", section, f"seed={seed}"]
    sc = load_scenario(SCENARIO, [*over, f"rounds={rounds}"])
    res = run_scenario(sc, workers=0)
    assert res.status == "completed", res.message
    return res.rows


def _time_to(rows: list[Row], target: float) -> float:
    """The simulated time of the first evaluation at ``target`` (inf: never)."""
    hits = [float(r["sim_time"]) for r in rows if float(r["test_accuracy"]) >= target]  # type: ignore[arg-type]
    return hits[0] if hits else math.inf


def _paired(times: list[float], base: list[float]) -> str:
    """The mean over seeds of (time to target) minus the same seed's without
    secure aggregation: the same devices drop in the same rounds in both
    (common random numbers), so the difference is what the threshold's
    failed rounds and the protocol's time cost. Seeds where either never
    reached the target are left out, and counted."""
    both = [a - b for a, b in zip(times, base, strict=True) if math.isfinite(a + b)]
    if not both:
        return "n/a"
    return f"{np.mean(both):+.0f} s ({len(both)}/{len(times)})"


def _expected_lost(p: float, t: int, n: int = COHORT) -> float:
    """P(fewer than t of n survive), each dropping with probability p."""
    return sum(math.comb(n, s) * (1 - p) ** s * p ** (n - s) for s in range(0, t))


def _label(threshold: float | None) -> str:
    if threshold is None:
        return "no SecAgg"
    return f"t = {math.ceil(round(threshold * COHORT, 9))} of {COHORT}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--target", type=float, default=0.6)
    args = ap.parse_args()
    lost: dict[tuple[float | None, float], float] = {}
    reach: dict[tuple[float | None, float], list[float]] = {}
    head = f"time to {args.target:.0%}"
    print(
        f"| threshold | dropout | rounds lost | expected | {head} | minus no SecAgg |"
    )
    print("|---|---|---|---|---|---|")
    for thr in THRESHOLDS:
        for p in DROPOUTS:
            runs = [_run(p, thr, s, args.rounds) for s in range(args.seeds)]
            fails = [bool(r.get("secagg_failed", False)) for rows in runs for r in rows]
            lost[thr, p] = float(np.mean(fails))
            reach[thr, p] = [_time_to(rows, args.target) for rows in runs]
            t = math.ceil(round(thr * COHORT, 9)) if thr is not None else 0
            times = [x for x in reach[thr, p] if math.isfinite(x)]
            n = f"({len(times)}/{args.seeds})"
            t_txt = f"{np.mean(times):.0f} s {n}" if times else "never"
            print(
                f"| {_label(thr)} | {p:.1f} | {lost[thr, p]:.0%} "
                f"| {_expected_lost(p, t):.0%} | {t_txt} "
                f"| {_paired(reach[thr, p], reach[None, p])} |"
            )
    _plot(lost, reach, args, ROOT / "docs" / "secagg-study.png")


def _cost_curves() -> dict[str, dict[str, list[float]]]:
    """Panel (c): a client's compute seconds (phases 1-3, at 2 GHz) and the
    server's unmasking seconds (one CPU socket) against the cohort, for 1M
    float32 parameters, 10% of the cohort dropped after sharing keys and a
    threshold of half the cohort."""
    out: dict[str, dict[str, list[float]]] = {}
    for protocol in ("secagg", "secagg_plus"):
        spec = SecAggSpec(protocol=protocol, threshold=0.5)  # type: ignore[arg-type]
        model = SecAggModel(spec, 1_000_000, 4, SERVER_PRESETS["cpu-socket"])
        client, server = [], []
        for n in _COHORTS:
            drop = n // 10
            plans = tuple(
                Plan(i, 1, 0.0, 1.0, i < drop, "dropout" if i < drop else "", 1.0, 1)
                for i in range(n)
            )
            cost = model.round_cost(n, RoundPlan(plans, 0.0, 1.0), _FLEET)
            client.append(model.cohort(n).client_s)
            server.append(cost.server_flops / model.server_rate)
        out[protocol] = {"client": client, "server": server}
    return out


_COHORTS = [10, 30, 100, 300, 1000, 3000]
# the cohort's links: the scenario's phones (20 Mbit/s down, 5 up, 0.1 s)
_FLEET = Fleet.from_spec(
    FleetSpec.model_validate(
        {
            "groups": [
                {
                    "name": "phones",
                    "count": _COHORTS[-1],
                    "speed": {"dist": "fixed", "steps_per_s": 5.0},
                    "network": {"down_mbps": 20, "up_mbps": 5, "latency_s": 0.1},
                }
            ]
        }
    ),
    seed=0,
)


def _plot(
    lost: dict[tuple[float | None, float], float],
    reach: dict[tuple[float | None, float], list[float]],
    args: argparse.Namespace,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.8))
    ps = np.array(DROPOUTS)
    for i, thr in enumerate(THRESHOLDS):
        color = f"C{i}"
        if thr is not None:
            t = math.ceil(round(thr * COHORT, 9))
            a.plot(
                ps,
                [100 * lost[thr, p] for p in ps],
                "o",
                color=color,
                label=_label(thr),
            )
            fine = np.linspace(0, ps[-1], 50)
            a.plot(
                fine, [100 * _expected_lost(p, t) for p in fine], "-", color=color, lw=1
            )
        mean = [
            np.mean([x if math.isfinite(x) else np.nan for x in reach[thr, p]])
            for p in ps
        ]
        b.plot(ps, mean, "o-", color=color, label=_label(thr))
    a.set_xlabel("dropout probability per device and round")
    a.set_ylabel("rounds lost (%)")
    a.set_title("(a) failed rounds: measured (dots), binomial (lines)")
    a.legend(fontsize=8)
    b.set_xlabel("dropout probability per device and round")
    b.set_ylabel(f"simulated s to {args.target:.0%} (mean of seeds that reached)")
    b.set_title(f"(b) time to {args.target:.0%} accuracy, {args.seeds} seeds")
    b.legend(fontsize=8)
    curves = _cost_curves()
    for protocol, style in (("secagg", "-"), ("secagg_plus", "--")):
        c.loglog(
            _COHORTS,
            curves[protocol]["server"],
            "o" + style,
            color="C3",
            label=f"{protocol}: server s",
        )
        c.loglog(
            _COHORTS,
            curves[protocol]["client"],
            "s" + style,
            color="C0",
            label=f"{protocol}: client s",
        )
    c.set_xlabel("cohort n (1M parameters, 10% dropped)")
    c.set_ylabel("simulated seconds a round")
    c.set_title("(c) the cost model: SecAgg vs SecAgg+")
    c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
