"""Client-level differential privacy (fedsim/privacy.py, docs/fleets.md
"Differential privacy"):

- epsilon per round is Opacus' own answer for the same sample rate, noise
  multiplier and steps (RDP and PRV accountants);
- amplification by sampling only where the selection is a uniform draw
  without device-dependent losses: power_of_choice, a deadline with
  stragglers, over-selection, devices offline report none and say why;
- clipped updates have norm <= C (sequential and batched training); the
  noise's std is z C scaled as the rule scales the sum;
- rows are the same on 0 and 2 Ray workers and through --resume;
- bad input is refused before training, naming the field.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from fedsim.algorithms.base import ClientUpdate
from fedsim.algorithms.fedavg import FedAvg
from fedsim.privacy import (
    Amplification,
    CentralNoise,
    Ledger,
    PrivacyError,
    PrivacySpec,
    clip,
    privatise,
)
from fedsim.runtime import _Run, run_scenario
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.selectors.bernoulli import mean_draws

from .conftest import SCENARIOS, fedsim_here
from .test_async_sim import _Stop, _stop_after, same_run

TINY = SCENARIOS / "ci" / "tiny-synthetic.yaml"  # 6 clients, 3 a round, fedavg
DP = "privacy={noise_multiplier: 1.1, clip_norm: 0.5, delta: 1.0e-5}"
POWER = "selector={name: power_of_choice, clients_per_round: 3}"


def _run(over, **kw):
    res = run_scenario(load_scenario(TINY, over), **{"workers": 0, **kw})
    assert res.status == "completed", res.message
    return res


def _opacus(accountant, z, q, steps, delta):
    """Opacus' own epsilon: its accountant stepped ``steps`` times."""
    acc = accountant()
    for _ in range(steps):
        acc.step(noise_multiplier=z, sample_rate=q)
    return acc.get_epsilon(delta)


def _amp(over):
    """What the accountant of TINY with ``over`` (and DP) may assume."""
    run = _Run(load_scenario(TINY, [DP, *over]), None, None)
    return run.ledger.amp


# ------------------------------------------------------------- accounting
def test_epsilon_per_round_is_opacus_own_answer():
    res = _run(["rounds=4", DP])
    eps = [r["dp_epsilon"] for r in res.rows]
    # a fixed cohort of 3 of 6 uniformly: q = 1/2
    want = [_opacus(RDPAccountant, 1.1, 0.5, t + 1, 1e-5) for t in range(4)]
    assert eps == pytest.approx(want, rel=1e-12)
    assert {r["dp_sample_rate"] for r in res.rows} == {0.5}
    assert {r["dp_amplification"] for r in res.rows} == {"fixed_cohort"}
    privacy = res.summary()["privacy"]
    assert privacy["epsilon"] == eps[-1] and privacy["delta"] == 1e-5
    assert privacy["rounds_accounted"] == 4
    json.dumps(privacy)  # summary.json takes it


def test_the_prv_accountant_is_opacus_own_answer_too():
    res = _run(["rounds=2", DP.replace("}", ", accountant: prv}")])
    want = [_opacus(PRVAccountant, 1.1, 0.5, t + 1, 1e-5) for t in range(2)]
    assert [r["dp_epsilon"] for r in res.rows] == pytest.approx(want, rel=1e-9)


def test_a_power_of_choice_run_reports_no_amplification_and_why():
    res = _run(["rounds=3", DP, POWER])
    assert {r["dp_sample_rate"] for r in res.rows} == {1.0}
    assert {r["dp_amplification"] for r in res.rows} == {"none"}
    why = res.rows[-1]["dp_why"]
    assert "power_of_choice" in why and "not a uniform draw" in why
    want = _opacus(RDPAccountant, 1.1, 1.0, 3, 1e-5)
    assert res.rows[-1]["dp_epsilon"] == pytest.approx(want, rel=1e-12)
    assert res.summary()["privacy"]["why"] == why
    # without amplification the same noise buys less privacy
    uniform = _run(["rounds=3", DP])
    assert uniform.rows[-1]["dp_epsilon"] < res.rows[-1]["dp_epsilon"]


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (["round.deadline_s=3", "fleet.stragglers={p: 0.3}"], "round.deadline_s 3"),
        (["round.over_select=1.5"], "round.over_select 1.5"),
        (
            ["fleet.groups[0].availability={kind: on_off}"],
            "fleet availability: devices go offline",
        ),
        (
            ["round={policy: fixed_window}", "fleet.stragglers={p: 0.2}"],
            "a slowed device may have no time for a step",
        ),
        (
            ["round={policy: fixed_window, window_s: 0.1}"],
            "has no time for a step",
        ),
        (
            ["selector={name: weighted, clients_per_round: 3}"],
            "favours clients by their data share",
        ),
        ([DP.replace("}", ", noise: local}")], "sampling hides nothing"),
    ],
    ids=[
        "deadline",
        "over-select",
        "offline",
        "window-stragglers",
        "window",
        "weighted",
        "local",
    ],
)
def test_device_dependent_participation_gets_no_amplification(over, words):
    amp = _amp(over)
    assert (amp.sample_rate, amp.kind) == (1.0, "none")
    assert words in amp.why


def test_uniform_draws_are_amplified_at_their_inclusion_rate():
    # a fixed cohort, also under fixed_window when every device has time
    amp = _amp(["round={policy: fixed_window, window_s: 60}"])
    assert (amp.sample_rate, amp.kind) == (0.5, "fixed_cohort")
    # equal dropout everywhere only thins the draw: still uniform
    assert _amp(["fleet.stragglers={dropout_p: 0.1}"]).sample_rate == 0.5
    # bernoulli: independent inclusion, redrawn when empty
    amp = _amp(["selector={name: bernoulli, q: 0.2, clients_per_round: 6}"])
    assert amp.kind == "poisson"
    assert amp.sample_rate == pytest.approx(0.2 * mean_draws(0.2, 6))


def test_a_prv_answer_opacus_cannot_give_stops_with_one_line_naming_the_field():
    spec = PrivacySpec(noise_multiplier=0.01, clip_norm=1.0, accountant="prv")
    ledger = Ledger(spec, Amplification(1.0, "none", "test"))
    with pytest.raises(PrivacyError, match=r"privacy.accountant 'prv': Opacus"):
        ledger.columns(0)


# ------------------------------------------------------------- clip and noise
def test_clip_bounds_the_norm_and_keeps_short_updates():
    g = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, 1e3):
        v = torch.randn(1000, generator=g) * scale
        out = clip(v, 0.5)
        assert float(out.double().norm()) <= 0.5 * (1 + 1e-6)
        if float(v.norm()) <= 0.5:
            assert torch.equal(out, v)  # a short update goes as it is
        else:  # the same direction
            assert torch.allclose(out / out.norm(), v / v.norm(), atol=1e-6)


@pytest.mark.parametrize("vectorize", [False, True], ids=["one-by-one", "batched"])
def test_every_update_sent_has_norm_at_most_the_clip_norm(vectorize):
    over = ["rounds=3", "privacy={noise_multiplier: 0, clip_norm: 0.05}"]
    res = _run([*over, f"resources.vectorize={str(vectorize).lower()}"])
    norms = [c["update_norm"] for c in res.clients if not c["dropped"]]
    assert max(norms) <= 0.05 * (1 + 1e-6)
    assert min(norms) > 0.05 * (1 - 1e-6)  # (this run's updates are all longer)
    plain = _run(["rounds=3", f"resources.vectorize={str(vectorize).lower()}"])
    assert max(c["update_norm"] for c in plain.clients) > 0.05


def test_compressed_updates_are_clipped_after_compression_and_billed_compressed():
    clip_only = "privacy={noise_multiplier: 0, clip_norm: 0.05}"
    res = _run(["rounds=2", "compression={name: top_k, k: 3}", clip_only])
    done = [c for c in res.clients if not c["dropped"]]
    assert max(c["update_norm"] for c in done) <= 0.05 * (1 + 1e-6)
    assert {c["bytes_up"] for c in done} == {3 * (4 + 4)}  # 3 values, 3 indices
    # without DP the same run's top-3 updates are longer than C
    plain = _run(["rounds=2", "compression={name: top_k, k: 3}"])
    assert max(c["update_norm"] for c in plain.clients) > 0.05
    assert "dp_epsilon" not in plain.rows[0] and "privacy" not in plain.summary()


def test_the_batched_executor_gives_the_sequential_dp_run():
    over = ["rounds=3", DP]
    batched = _run([*over, "resources.vectorize=true"])
    one_by_one = _run(over)
    assert torch.allclose(batched.final_params, one_by_one.final_params, atol=1e-5)


def test_the_servers_noise_has_std_z_c_scaled_as_the_rule_scales_the_sum():
    # Prepare: four zero updates of equal weight; fedavg averages them
    d, z, c = 200_000, 1.5, 0.4
    ups = [ClientUpdate(i, torch.zeros(d), 1.0, 1, 1.0, 0.0) for i in range(4)]
    noise = CentralNoise(PrivacySpec(noise_multiplier=z, clip_norm=c), seed=7)

    # Execute: the rule's step on the noised updates
    state, _ = FedAvg().aggregate({"x": torch.zeros(d)}, noise.add(FedAvg(), ups, 3))

    # Assert: N(0, (z C / 4)^2) in every coordinate (a generous bound)
    x = state["x"].double()
    assert abs(float(x.mean())) < 0.01 * z * c
    assert float(x.std()) == pytest.approx(z * c / 4, rel=0.02)
    # the originals are left alone; (seed, round) decides the draw
    assert all(float(u.delta.abs().sum()) == 0 for u in ups)
    again, _ = FedAvg().aggregate({"x": torch.zeros(d)}, noise.add(FedAvg(), ups, 3))
    other, _ = FedAvg().aggregate({"x": torch.zeros(d)}, noise.add(FedAvg(), ups, 4))
    assert torch.equal(again["x"], state["x"])
    assert not torch.equal(other["x"], state["x"])


def test_unequal_weights_scale_the_noise_by_the_largest():
    spec = PrivacySpec(noise_multiplier=2.0, clip_norm=0.5)
    assert CentralNoise(spec, 0).std([0.1, 0.6, 0.3]) == pytest.approx(2 * 0.5 * 0.6)


def test_local_noise_has_std_z_c_on_each_client():
    spec = PrivacySpec(noise_multiplier=0.8, clip_norm=2.0, noise="local")
    out = privatise(spec, torch.zeros(200_000), client_seed=11)
    assert float(out.double().std()) == pytest.approx(0.8 * 2.0, rel=0.02)
    assert torch.equal(out, privatise(spec, torch.zeros(200_000), client_seed=11))


def test_noise_changes_the_run_and_local_noise_is_accounted_at_z_over_2():
    clipped = _run(["rounds=2", "privacy={noise_multiplier: 0, clip_norm: 0.5}"])
    noised = _run(["rounds=2", DP])
    assert not torch.equal(clipped.final_params, noised.final_params)
    assert math.isinf(clipped.rows[-1]["dp_epsilon"])  # no noise: no guarantee
    local = _run(["rounds=2", DP.replace("}", ", noise: local}")])
    assert not torch.equal(local.final_params, noised.final_params)
    want = _opacus(RDPAccountant, 1.1 / 2, 1.0, 2, 1e-5)
    assert local.rows[-1]["dp_epsilon"] == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------- determinism
def test_a_resumed_dp_run_equals_an_uninterrupted_one(tmp_path):
    # Prepare: checkpoints every 2 rounds, stopped after round 2
    sc = load_scenario(TINY, ["rounds=5", DP, "checkpoint.every_rounds=2"])
    ref = run_scenario(sc, workers=0)
    with pytest.raises(_Stop):
        run_scenario(sc, workers=0, run_dir=tmp_path, on_round=_stop_after(2))

    # Execute
    res = run_scenario(sc, workers=0, run_dir=tmp_path, resume=True)

    # Assert: the same noise, the same epsilon, the same model
    same_run(res, ref)


@pytest.mark.ray
def test_zero_and_two_ray_workers_agree_on_a_dp_run(ray_session):
    for noise in ("central", "local"):
        sc = load_scenario(TINY, ["rounds=3", DP.replace("}", f", noise: {noise}}}")])
        local, two = run_scenario(sc, workers=0), run_scenario(sc, workers=2)
        same_run(local, two)


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("privacy={noise_multiplier: -1, clip_norm: 1}", "privacy.noise_multiplier"),
        ("privacy={noise_multiplier: 1, clip_norm: 0}", "privacy.clip_norm"),
        ("privacy={noise_multiplier: 1, clip_norm: -2}", "privacy.clip_norm"),
        ("privacy={noise_multiplier: 1, clip_norm: 1, delta: 0}", "privacy.delta"),
        ("privacy={noise_multiplier: 1, clip_norm: 1, delta: 1}", "privacy.delta"),
        ("privacy={noise_multiplier: 1, clip_norm: 1, delta: 2}", "privacy.delta"),
        ("privacy={noise_multiplier: 1}", "privacy.clip_norm"),
        ("privacy={noise_multiplier: 1, clip_norm: 1, noise: far}", "privacy.noise"),
    ],
)
def test_a_bad_privacy_section_exits_2_naming_the_field(setting, words):
    r = fedsim_here("validate", str(TINY), "--set", setting)
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (["algorithm={name: fednova}"], "algorithm.name: 'fednova': its server step"),
        (["algorithm={name: scaffold}"], "algorithm.name: 'scaffold': its server step"),
        (
            ["compression={name: top_k, k: 3}", DP.replace("}", ", noise: local}")],
            "privacy.noise: 'local' makes every update dense",
        ),
    ],
    ids=["fednova", "scaffold", "local-compressed"],
)
def test_a_rule_or_setting_dp_cannot_bound_is_refused(over, words):
    with pytest.raises(ScenarioError, match=words) as err:
        load_scenario(TINY, [DP, *over])  # (a later privacy= replaces DP)
    assert err.value.exit_code == 2


def test_an_asynchronous_run_is_refused():
    fedbuff = SCENARIOS / "async-fedbuff.yaml"
    with pytest.raises(ScenarioError, match="round.policy: 'async': the privacy"):
        load_scenario(fedbuff, [DP])


def test_without_opacus_one_line_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "opacus", None)  # as if not installed
    out = tmp_path / "run"
    r = fedsim_here("run", str(TINY), "--workers", "0", "--out", str(out), "--set", DP)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "privacy.accountant: needs Opacus" in r.stderr
    assert "pip install 'fedsim[privacy]'" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (out / "rounds.parquet").exists()  # refused before training
