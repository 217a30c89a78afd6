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
About a minute of CPU on one core (54 s user time for the figures of
docs/fleets.md; 5.6 minutes of wall time on a shared machine).
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


Reach = tuple[float, bool]  # (simulated seconds, whether the target was hit)


def _time_to(rows: list[Row], target: float) -> Reach:
    """The simulated time of the first evaluation at ``target``, or the
    run's end when it never got there (censored: a lower bound)."""
    for r in rows:
        if float(r["test_accuracy"]) >= target:  # type: ignore[arg-type]
            return float(r["sim_time"]), True  # type: ignore[arg-type]
    return float(rows[-1]["sim_time"]), False  # type: ignore[arg-type]


def _paired(times: list[Reach], base: list[Reach]) -> tuple[float, bool]:
    """The mean over seeds of (time to target) minus the same seed's without
    secure aggregation, and whether it is only a lower bound (some seed
    never reached the target with it: its run's end stands in). The same
    devices drop in the same rounds in both runs of a seed (common random
    numbers), so the difference is what the threshold's failed rounds and
    the protocol's time cost."""
    diffs = [a[0] - b[0] for a, b in zip(times, base, strict=True)]
    return float(np.mean(diffs)), not all(a[1] for a in times)


def _reach_text(times: list[Reach], paired: tuple[float, bool]) -> str:
    """``mean s (k/n) | +d s`` for the table, ">= " where censored."""
    ge = "" if all(t[1] for t in times) else ">= "
    k = sum(t[1] for t in times)
    mean = np.mean([t[0] for t in times])
    d, low = paired
    return f"{ge}{mean:.0f} s ({k}/{len(times)}) | {'>= ' if low else ''}{d:+.0f} s"


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
    reach: dict[tuple[float | None, float], list[Reach]] = {}
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
            paired = _paired(reach[thr, p], reach[None, p])
            print(
                f"| {_label(thr)} | {p:.1f} | {lost[thr, p]:.0%} "
                f"| {_expected_lost(p, t):.0%} | {_reach_text(reach[thr, p], paired)} |"
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
    reach: dict[tuple[float | None, float], list[Reach]],
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
        if thr is not None:  # the paired extra time; hollow: a lower bound
            for p in ps:
                d, low = _paired(reach[thr, p], reach[None, p])
                face = "none" if low else color
                b.plot([p], [d], "o", color=color, mfc=face)
            extra = [_paired(reach[thr, p], reach[None, p])[0] for p in ps]
            b.plot(ps, extra, "-", color=color, label=_label(thr))
    a.set_xlabel("dropout probability per device and round")
    a.set_ylabel("rounds lost (%)")
    a.set_title("(a) failed rounds: measured (dots), binomial (lines)")
    a.legend(fontsize=8)
    b.set_xlabel("dropout probability per device and round")
    b.axhline(0.0, color="grey", lw=0.8)
    b.set_ylabel("extra simulated s (same seed, no SecAgg)")
    b.set_title(
        f"(b) time to {args.target:.0%} accuracy, {args.seeds} seeds\n"
        "hollow: some seed never reached it (its run's end: a lower bound)",
        fontsize=9,
    )
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
