"""benchmarks/gallery.py: every claim's runs validate, the verdict rules on
constructed numbers, and the tiny variant end to end (doc, table, figure,
verdict per claim, the cache on a second call)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

from fedsim.tools.compare import load_variant
from fedsim.tools.stats import paired_interval

from .conftest import MNIST, ROOT, assert_figure

_spec = importlib.util.spec_from_file_location(
    "fedsim_gallery", ROOT / "benchmarks" / "gallery.py"
)
assert _spec is not None and _spec.loader is not None
gallery = importlib.util.module_from_spec(_spec)
sys.modules["fedsim_gallery"] = gallery  # dataclasses look their module up
_spec.loader.exec_module(gallery)


@pytest.fixture
def data_root(monkeypatch):
    """The MNIST test set for the claims that read it."""
    if not (MNIST / "mnist-test").is_dir():
        pytest.skip("needs ../shared/data/mnist-test")
    monkeypatch.setenv("FEDSIM_DATA_ROOT", str(MNIST))


# ------------------------------------------------------------ the claims
@pytest.mark.parametrize("claim", gallery.CLAIMS, ids=lambda c: c.name)
def test_every_arm_of_every_claim_validates(claim):
    # Prepare / Execute: each arm as the gallery runs it, full and tiny
    for arm in claim.arms:
        for tiny in (False, True):
            overrides = gallery.run_overrides(claim, arm, tiny)
            label = arm.label(tiny)
            sc, mode = load_variant(ROOT / claim.scenario, label, 0, overrides)
            # Assert: the gallery's rounds and the arm's algorithm and its
            # hyperparameters as the label gives them
            assert mode == "sync"
            assert sc.rounds == (2 if tiny else claim.rounds)
            name, _, params = label.partition(":")
            assert sc.algorithm.name == name
            for item in filter(None, params.split(",")):
                key, value = item.split("=")
                assert str(getattr(sc.algorithm, key)) == value, (label, key)
    winners = {w for w, _ in claim.better}
    losers = {name for _, ls in claim.better for name in ls}
    assert (winners | losers | set(claim.paper_values)) <= {a.name for a in claim.arms}


def test_the_fednova_panels_compare_both_weightings():
    for name in ("fednova-fig5-sampled", "fednova-fig5-random"):
        labels = {a.algorithm for a in gallery.BY_NAME[name].arms}
        assert {"fednova", "fednova:sampling=uniform"} <= labels


def test_the_full_gallery_fits_its_budget():
    total = sum(
        gallery.estimate_s(c, gallery.DEFAULT_SEEDS) for c in gallery.CORE_CLAIMS
    )
    assert total < gallery.BUDGET_S


# ------------------------------------------------------------ the verdicts
def _records(claim, values, key="final_accuracy", diverged=()):
    """Fake run records: ``values`` maps an arm to its per-seed numbers."""
    out = []
    for arm, xs in values.items():
        for seed, x in enumerate(xs):
            row = {
                "final_accuracy": x if key == "final_accuracy" else 0.5,
                "diverged": arm in diverged,
                "rounds_to_target": None,
                "bytes_up_to_target": None,
                "bytes_up": 100,
                "rounds": 6,
            }
            rounds = [{"round": 0, "test_loss": x, "test_accuracy": 0.5}]
            out.append(
                {"arm": arm, "seed": seed, "row": row, "rounds": rounds, "wall_s": 1.0}
            )
    return out


def _verdict(claim, records):
    return gallery.verdict(claim, gallery.summarize(claim, records))


# six seeds (fewer never decide: the sign-flip test's smallest p is 2/2^n)
SIX = [0.0, 0.002, -0.001, 0.001, 0.003, -0.002]


def _six(base, step=0.0):
    """Six per-seed values: ``base`` plus a shared seed effect, plus ``step``."""
    return [base + e + step for e in SIX]


# FedAvg, FedProx and SCAFFOLD near the paper's 98.5%, behind FedDC's claim
_BEHIND = {"fedavg": _six(0.985), "fedprox": _six(0.984), "scaffold": _six(0.985)}


def _uncut(name):
    """The claim ``name`` judged as if run at the paper's setting (no cut)."""
    return dataclasses.replace(gallery.BY_NAME[name], cut="")


def test_the_symmetric_rule_on_accuracy():
    # Prepare: FedDC's claim (higher accuracy), at the paper's setting; the
    # arms share seeds 0..5, so the comparisons are paired
    claim = _uncut("feddc-synthetic-01")
    near = {**_BEHIND, "feddyn": _six(0.992), "feddc": _six(0.996)}
    lost = {**near, "feddc": _six(0.82)}  # behind both, beyond the spread
    # behind feddyn in the mean, but some seeds ahead: within the spread
    mixed = {**near, "feddc": [0.98, 0.995, 0.99, 0.985, 0.996, 0.98]}
    # ahead of feddyn in the mean, within the spread: the mirror of mixed
    mirror = {**near, "feddc": [1.004, 0.989, 0.994, 0.999, 0.988, 1.004]}
    off = {**near, "fedavg": _six(0.905)}  # off the paper's 98.52%

    # Execute / Assert
    v, why = _verdict(claim, _records(claim, near))
    assert v == "holds" and "paired over 6 seeds" in why
    v, why = _verdict(claim, _records(claim, lost))
    assert v == "does not hold" and "against the claim: feddc vs feddyn" in why
    for case in (mixed, mirror):  # a loss or a win within the spread alike
        v, why = _verdict(claim, _records(claim, case))
        assert v == "inconclusive" and "within the spread: feddc vs feddyn" in why
    v, why = _verdict(claim, _records(claim, off))
    assert v == "holds" and "fedavg 90.55% vs the paper's 98.52%" in why


def test_divergence_of_either_arm_counts_alike():
    # Prepare: the claim holds on six seeds; then seed 0 of the claimed
    # winner, or of a claimed loser, diverged
    claim = _uncut("feddc-synthetic-01")
    near = {**_BEHIND, "feddyn": _six(0.992), "feddc": _six(0.996)}
    for arm in ("feddc", "feddyn"):
        records = _records(claim, near)
        for r in records:
            r["row"]["diverged"] = r["arm"] == arm and r["seed"] == 0
        # Execute
        v, why = _verdict(claim, records)
        # Assert: that pair left out and said, either way: five pairs left,
        # too few to decide
        assert f"{arm} diverged in 1/6 seeds" in why
        assert "feddc vs feddyn on final test accuracy: paired over 5 seeds" in why
        assert "(1 pairs left out: a run diverged)" in why
        assert v == "inconclusive", why


def test_one_paired_rule_and_no_unpaired_fallback():
    # Prepare: seed-to-seed variation both arms share (0.80 to 0.90) and a
    # steady 1-point lead
    claim = _uncut("feddc-synthetic-01")
    shared = [0.80, 0.90, 0.85, 0.82, 0.88, 0.86]
    lead = [0.010, 0.011, 0.009, 0.0105, 0.0095, 0.010]
    acc = {
        **dict.fromkeys(("fedavg", "fedprox", "scaffold", "feddyn"), shared),
        "feddc": [x + d for x, d in zip(shared, lead, strict=True)],
    }
    records = _records(claim, acc)
    # Execute
    s = gallery.summarize(claim, records)
    side, evidence = gallery.compare_arms(s, "accuracy", "feddc", "feddyn")
    # Assert: the paired interval, as fedsim compare computes it
    iv = paired_interval([(a - b) for a, b in zip(acc["feddc"], shared, strict=True)])
    assert side == "held", evidence
    assert f"95% interval [{100 * iv.lo:.4g}, {100 * iv.hi:.4g}], better" in evidence
    # seeds not shared: only the shared one is paired, never the means
    unpaired = [r for r in records if not (r["arm"] == "feddyn" and r["seed"] > 0)]
    s = gallery.summarize(claim, unpaired)
    side, evidence = gallery.compare_arms(s, "accuracy", "feddc", "feddyn")
    assert side == "within", evidence
    assert evidence == "1 paired seed(s): feddc's lead 1 points"
    # an arm never run reads "not run"
    s = gallery.summarize(claim, [r for r in records if r["arm"] != "feddyn"])
    assert gallery.compare_arms(s, "accuracy", "feddc", "feddyn") == (
        "within",
        "feddyn not run",
    )


def test_until_decided_judges_by_the_confidence_sequence():
    # Prepare: six seeds, each feddc ahead of feddyn by 0.3 to 1.5 points:
    # the fixed-n interval decides, the sequence (valid however often seeds
    # were added and looked at) is wider and does not yet
    claim = _uncut("fednova-fig5-full")
    lead = [0.003, 0.015, 0.006, 0.012, 0.0045, 0.01]
    base = _six(0.9)
    acc = {
        "fedavg": base,
        "fedprox": [x + 0.1 for x in base],
        "fednova": [x - d for x, d in zip(base, lead, strict=True)],
    }
    records = _records(claim, acc, "objective")
    fixed = gallery.summarize(claim, records)
    anytime = gallery.summarize(claim, records, until_decided=True)
    # Execute / Assert
    assert gallery.compare_arms(fixed, "objective", "fednova", "fedavg")[0] == "held"
    assert gallery.compare_arms(anytime, "objective", "fednova", "fedavg")[0] == (
        "within"
    )
    assert gallery.decided(claim, fixed) and not gallery.decided(claim, anytime)
    # a reversal decides too: more seeds would not make it hold
    bad = _records(claim, {**acc, "fednova": _six(1.5)}, "objective")
    assert gallery.decided(claim, gallery.summarize(claim, bad, until_decided=True))


def test_an_until_decided_section_names_its_sequence_and_its_rule():
    # a reader must know which interval decided and how to repeat the
    # stopping rule: "--seeds 8" alone would rerun the fixed-n rule
    claim = _uncut("fednova-fig5-full")
    records = _records(claim, {a.name: _six(0.9) for a in claim.arms}, "objective")
    s = gallery.summarize(claim, records, until_decided=True)
    _, evidence = gallery.compare_arms(s, "objective", "fednova", "fedavg")
    assert "95% confidence sequence [" in evidence
    fixed = gallery.summarize(claim, records)
    assert (
        "95% interval ["
        in gallery.compare_arms(fixed, "objective", "fednova", "fedavg")[1]
    )
    cmd = gallery.command(claim, 8, False, (4, 20))
    assert cmd.endswith(
        "--only fednova-fig5-full --seeds 4 --until-decided --max-seeds 20"
    )
    assert gallery.command(claim, 8, False).endswith("--seeds 8")


def test_the_page_counts_the_claims_decided_by_kind():
    # the count a reader looks for first: reduced claims are not decided
    def section(name: str, verdict: str) -> str:
        head = json.dumps({"verdict": verdict, "reason": "", "ours": ""})
        return f"<!-- claim:{name} {head} -->\n## x"

    names = [c.name for c in gallery.CLAIMS]
    kept = {
        names[0]: section(names[0], "holds"),
        names[1]: section(names[1], "does not hold"),
        names[2]: section(names[2], "inconclusive (reduced: 6 of 20 rounds)"),
        names[3]: section(names[3], "inconclusive (reduced: 5 of 1,000 iterations)"),
        names[4]: section(names[4], "inconclusive"),
        names[5]: section(names[5], "not rerun"),
    }
    rest = len(names) - 6
    assert gallery.decided_counts(kept) == (
        f"Decided (holds or does not hold): 2 of {len(names)} claims (1 holds, "
        f"1 does not hold, 2 inconclusive (reduced), 1 inconclusive, "
        f"1 not rerun, {rest} not run yet)."
    )


def test_a_cut_claim_is_inconclusive_both_ways():
    # a reduced setting neither confirms nor refutes the claim
    claim = dataclasses.replace(
        gallery.BY_NAME["feddc-synthetic-01"], cut="150 of 300 rounds"
    )
    near = {**_BEHIND, "feddyn": _six(0.992), "feddc": _six(0.996)}
    lost = {**near, "feddc": _six(0.82)}
    label = f"inconclusive (reduced: {claim.cut})"
    v, why = _verdict(claim, _records(claim, near))
    assert v == label and why.startswith("would be holds: ")
    v, why = _verdict(claim, _records(claim, lost))
    assert v == label and why.startswith("would be does not hold: ")
    assert "against the claim: feddc vs feddyn" in why


def test_verdicts_on_the_objective_lower_is_better():
    claim = _uncut("fednova-fig5-full")
    good = {"fedavg": _six(0.9), "fedprox": _six(0.91), "fednova": _six(0.5)}
    bad = {**good, "fednova": _six(0.95)}
    one_seed = {k: v[:1] for k, v in good.items()}
    assert _verdict(claim, _records(claim, good, "objective"))[0] == "holds"
    v, why = _verdict(claim, _records(claim, bad, "objective"))
    assert v == "does not hold" and "fednova vs fedavg" in why
    v, why = _verdict(claim, _records(claim, one_seed, "objective"))
    assert v == "inconclusive" and "1 paired seed(s)" in why


def test_final_is_the_last_evaluation_for_the_objective_too():
    rounds = [{"test_loss": x} for x in (0.9, 0.5, 0.7, None, 0.6)]
    assert gallery.final_objective(rounds) == 0.6  # not the mean of a tail


def test_every_paper_cell_off_is_named_rounds_included():
    # Prepare: FedDC Table 1 (IID, full participation: the paper's FedDC 24,
    # FedDyn 38 rounds); ours 55.5 and 29.5 rounds
    claim = _uncut("feddc-fmnist-iid-full")
    records = _records(claim, {a.name: [0.9, 0.9] for a in claim.arms})
    hits = {"feddc": (50, 61), "feddyn": (29, 30), "fedavg": (112, 112)}
    for r in records:
        r["row"]["rounds"] = 300
        r["row"]["rounds_to_target"] = hits.get(r["arm"], (130, 131))[r["seed"]]
    s = gallery.summarize(claim, records)
    # Execute
    notes = gallery.off_paper(claim, s)
    # Assert: FedDC and FedDyn named in rounds; FedAvg (112 = 112) is not
    assert any(n.startswith("feddc 55.5 ± 7.8 rounds vs the paper's 24") for n in notes)
    assert any(
        n.startswith("feddyn 29.5 ± 0.7 rounds vs the paper's 38") for n in notes
    )
    assert not any(n.startswith("fedavg") for n in notes)
    # and the summary table names the input scaling of the claim's runs
    row = gallery._summary_row(claim, None)
    assert "(inputs: mean/std normalisation" in row.split("|")[1]


def test_a_kept_section_of_another_rule_reads_not_rerun():
    # Prepare: sections as an earlier rule wrote them, either way
    claim = gallery.BY_NAME["fedpns-fig3-mlr"]
    old = (
        '<!-- claim:fedpns-fig3-mlr {"verdict": "does not hold", '
        '"reason": "fedavg ahead of fedpns on final test accuracy", "ours": "x"} -->\n'
        "## t\n\n**Verdict: does not hold** (fedavg ahead of fedpns on final "
        "test accuracy).\n\n<!-- /claim:fedpns-fig3-mlr -->"
    )
    held = old.replace("does not hold", "holds")
    for section, said in ((old, "does not hold"), (held, "holds")):
        # Execute
        new = gallery.rejudge_kept(claim, section)
        # Assert: no verdict kept, in the header and the body
        assert new.count("not rerun") == 2 and f"which said '{said}'" in new
        assert gallery.rejudge_kept(claim, new) == new  # once
        assert "**not rerun**" in gallery._summary_row(claim, new)
    # a section this rule judged is kept as it is
    mine = gallery._header_json(claim, "holds", "r", "x") + "\n## t\n"
    assert gallery.rejudge_kept(claim, mine) == mine


def test_the_feddc_synthetic_scenarios_start_from_zeros():
    # docs/algorithms.md 2.2: the FedDyn/FedDC codes' zero-initialised model
    import torch

    from fedsim.data import build_data
    from fedsim.models import make_model
    from fedsim.params import flatten
    from fedsim.runtime import run_setup
    from fedsim.scenario import load_scenario

    for stem in ("00", "01", "10"):
        sc = load_scenario(
            ROOT / "scenarios" / "papers" / f"feddc-synthetic-{stem}.yaml"
        )
        data = build_data(sc.data, sc.num_clients, sc.seed)
        x = flatten(make_model(run_setup(sc).network, data))
        assert torch.count_nonzero(x) == 0, stem


def test_a_missed_target_counts_as_the_whole_run():
    # Prepare: FedDM reaches the target in 3 rounds (1,000 bytes); FedAvg in
    # one seed of two (round 5), SCAFFOLD never (each run: 6 rounds, 100 bytes)
    claim = _uncut("feddm-mnist-dir0.5")
    acc = {"feddm": [0.9, 0.9], "fedavg": [0.8, 0.8], "scaffold": [0.8, 0.8]}
    records = _records(claim, acc)
    for r in records:
        if r["arm"] == "feddm":
            r["row"].update(rounds_to_target=3, bytes_up_to_target=50)
        if r["arm"] == "fedavg" and r["seed"] == 0:
            r["row"].update(rounds_to_target=5, bytes_up_to_target=90)

    # Execute
    s = gallery.summarize(claim, records)
    v, why = gallery.verdict(claim, s)

    # Assert: fedavg (5 + 7) / 2 = 6 rounds, (90 + 100) / 2 bytes; scaffold
    # never: inf
    assert gallery._target_value(s["arms"]["fedavg"], "rounds_to_target") == (
        6.0,
        pytest.approx(math.sqrt(2)),
    )
    assert gallery._target_value(s["arms"]["fedavg"], "bytes_to_target")[0] == 95
    assert math.isinf(
        gallery._target_value(s["arms"]["scaffold"], "rounds_to_target")[0]
    )
    # paired: fedavg's seed 1 (a miss, 7 rounds) against feddm's 3 leaves
    # differences 2 and 4 (95% interval [-10.7, 16.7]): within the spread
    assert v == "inconclusive" and "fedavg reached 90% in 1/2 seeds" in why
    assert "scaffold reached 90% in 0/2 seeds" in why
    assert "feddm vs scaffold on rounds to 90%: paired over 2 seeds" in why


def test_an_arm_with_no_run_reads_not_run_not_a_miss():
    # Prepare: FedDM reaches the target, FedAvg misses it, SCAFFOLD has no run
    # (the pixels / 255 row once showed its unrun arms as "not reached")
    claim = _uncut("feddm-mnist-dir0.5")
    records = _records(claim, {"feddm": [0.9, 0.9], "fedavg": [0.8, 0.8]})
    for r in records:
        if r["arm"] == "feddm":
            r["row"].update(rounds_to_target=3, bytes_up_to_target=50)
    # Execute
    s = gallery.summarize(claim, records)
    table = "\n".join(gallery.claim_table(claim, s))
    line = gallery._winner_text(claim, s)
    # Assert: the miss reads as a miss, the absent arm as not run
    assert "fedavg not reached" in line and "scaffold not run" in line
    assert "| scaffold | 0 | not run | - |" in table
    assert "| fedavg | 2 |" in table and "not reached (0/2)" in table


# ------------------------------------------------------------ end to end
TINY_CLAIMS = ["fednova-fig5-sampled", "fedpns-fig6-bn2", "feddc-synthetic-01"]


@pytest.mark.slow
def test_tiny_gallery_writes_the_doc_and_reuses_its_runs(tmp_path, data_root, capsys):
    # Prepare: three claims (an objective, a selector arm, paper numbers)
    out, only = tmp_path / "g", ",".join(TINY_CLAIMS)

    # Execute
    assert gallery.main(["--tiny", "--only", only, "--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert gallery.main(["--tiny", "--only", only, "--out", str(out)]) == 0
    second = capsys.readouterr().out

    # Assert: a summary row per claim, a section with its table, figure,
    # command and verdict for each claim run, "not run yet" for the others
    doc = (out / "reproductions.md").read_text()
    assert "| claim | paper | this code (mean) | verdict |" in doc
    verdicts = re.findall(
        r"\*\*Verdict: (holds|does not hold|inconclusive[^*]*)\*\*", doc
    )
    assert len(verdicts) == len(TINY_CLAIMS)
    assert doc.count("| not run yet | - |") == len(gallery.CLAIMS) - len(TINY_CLAIMS)
    for name in TINY_CLAIMS:
        claim = gallery.BY_NAME[name]
        section = doc[
            doc.index(f"<!-- claim:{name} ") : doc.index(f"<!-- /claim:{name} -->")
        ]
        assert "| arm | seeds | final acc % |" in section
        for arm in claim.arms:  # each arm's own run, in its own row
            cells = _row(section, arm.name)
            assert cells[1] == "1", cells
            assert (
                cells[2].split(" ± ")[0] == f"{100 * _run_accuracy(out, name, arm):.2f}"
            )
        assert f"--only {name} --seeds 1 --tiny" in section
        assert_figure(out / "reproductions" / f"{name}.png", (11, 3.8))
    # FedDC's row: this code's number (a 2-round tiny run) beside the paper's
    feddc = _row(doc, "feddc")
    assert feddc[-2] == "99.62" and feddc[2].split(" ± ")[0] != "99.62", feddc
    # the second call ran nothing: every run came from the cache
    n_runs = sum(len(gallery.BY_NAME[n].arms) for n in TINY_CLAIMS)
    assert first.count("(cached)") == 0 and second.count("(cached)") == n_runs


def _row(text: str, arm: str) -> list[str]:
    """The cells of the first table row of ``arm`` in ``text``."""
    (line, *_) = [ln for ln in text.splitlines() if ln.startswith(f"| {arm} | ")]
    return [c.strip() for c in line.strip("|").split("|")]


def _run_accuracy(out, claim: str, arm) -> float:
    """The final accuracy the gallery's cached run of ``arm`` (seed 0) recorded."""
    import json

    stem = gallery._stem(arm.name)
    record = json.loads((out / "runs" / claim / f"{stem}-seed0.json").read_text())
    return float(record["row"]["final_accuracy"])


# ------------------------------------------------- FedDC Fashion-MNIST, tiny
FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


@pytest.mark.slow
def test_tiny_feddc_fashion_mnist_runs_stop_at_the_target(tmp_path, monkeypatch):
    # Prepare: the IID 15% claim, tiny (2,000 images, 2 rounds, 1 epoch),
    # FedAvg and FedDC; a target every run reaches at once, and 89%, which a
    # 2-round tiny run cannot reach
    if not Path(FMNIST).is_file():
        pytest.skip(f"Fashion-MNIST not found at {FMNIST}")
    monkeypatch.delenv("FEDSIM_DATA_ROOT", raising=False)
    full = gallery.BY_NAME["feddc-fmnist-iid-15"]
    arms = tuple(a for a in full.arms if a.name in ("fedavg", "feddc"))
    claim = dataclasses.replace(full, arms=arms, better=(("feddc", ("fedavg",)),))
    at_once = dataclasses.replace(claim, target=0.0, also_targets=())

    # Execute
    runs, missing = gallery.run_claim(at_once, 1, True, tmp_path / "a", False)
    misses, _ = gallery.run_claim(claim, 1, True, tmp_path / "b", False)
    s = gallery.summarize(claim, misses)
    section = "\n".join(gallery.claim_table(claim, s))

    # Assert: stopped after round 1 (its row the last), or all 2 rounds run
    assert not missing
    for rec in runs:
        assert len(rec["rounds"]) == 1 and rec["row"]["rounds_to_target"] == 1
        assert rec["row"]["stopped_at_target"] is True
    for rec in misses:
        assert len(rec["rounds"]) == 2 and rec["row"]["rounds_to_target"] is None
    # the table: per-seed rounds (a miss: more than the 2 rounds run), the
    # paper's cells for FedAvg and FedDC, the lower targets
    assert "| rounds to 85% | rounds to 87% | rounds to 89%, per seed | paper |" in (
        section
    )
    assert _row(section, "fedavg")[5:7] == [">2", "144"]
    assert _row(section, "feddc")[5:7] == [">2", "63"]
    assert gallery.verdict(claim, s)[0] == "inconclusive"  # one seed, no spread
    # a second pass with --cached-only style reads the cache, runs nothing
    again, none = gallery.run_claim(claim, 2, True, tmp_path / "b", False, True)
    assert len(again) == 2 and sorted(none) == ["fedavg seed 1", "feddc seed 1"]
    v, _ = gallery.verdict(claim, gallery.summarize(claim, again), none)
    assert v.startswith("inconclusive (reduced: not run: ") and "fedavg seed 1" in v


# ------------------------------------------------------------ bad arguments
@pytest.mark.parametrize("seeds", ["0", "-2", "two"])
def test_a_seed_count_below_one_is_refused(seeds, capsys):
    # --seeds 0 once ran the default 3 seeds and --seeds -2 printed a
    # negative estimate with exit 0
    with pytest.raises(SystemExit) as e:
        gallery.main(["--seeds", seeds, "--estimate"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"--seeds: expected a whole number of seeds, at least 1; got '{seeds}'" in err
    )


def test_out_and_doc_that_cannot_be_written_are_refused_before_any_run(
    tmp_path, capsys
):
    # Prepare: a file where the runs' folder should be, a folder where the
    # page should be, and a page under a file
    a_file = tmp_path / "runs.txt"
    a_file.write_text("x")
    cases = [
        (["--out", str(a_file)], f"--out {a_file}: expected a writable folder"),
        (["--out", str(a_file / "sub")], "Not a directory"),
        (["--doc", str(tmp_path)], f"--doc {tmp_path}: expected a Markdown file"),
        (["--doc", str(a_file / "page.md")], "the page and its figures go in"),
    ]
    for argv, said in cases:
        # Execute: the cheapest claim, which would otherwise train
        with pytest.raises(SystemExit) as e:
            gallery.main([*argv, "--only", "fedpns-fig6-bn2", "--tiny"])
        # Check: exit 2, one line naming the option, before anything ran
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "fedpns-fig6-bn2").exists()
    assert not list(tmp_path.rglob("*.json"))


def test_the_cost_table_reads_a_section_stopped_until_decided():
    # a section whose seeds were added until decided says where it stopped;
    # the cost table reads its seeds and minutes from it (it once read "-")
    claim = gallery.BY_NAME["fednova-fig5-full"]
    section = (
        "- **Command**: `... --only fednova-fig5-full --seeds 4 --until-decided "
        "--max-seeds 20` (38.6 min of runs here; it stopped at 8 seeds)."
    )
    row = gallery._cost_row(claim, section)
    assert row.startswith("| fednova-fig5-full | 3 x 8 | 200 |") and "| 38.6 |" in row
    fixed = "- **Command**: `... --seeds 6` (20.8 min of runs here)."
    assert "| 3 x 6 |" in gallery._cost_row(claim, fixed)
    assert "| 20.8 |" in gallery._cost_row(claim, fixed)


# ------------------------------------------------------- runs side by side
def _without_wall_clock(rec):
    """A run record less what the wall clock decides (its seconds), as JSON
    text (so that NaN, a metric not evaluated, equals NaN)."""
    row = {k: v for k, v in rec["row"].items() if k != "wall_time_s"}
    rounds = [{k: v for k, v in r.items() if k != "wall_time"} for r in rec["rounds"]]
    return json.dumps([rec["arm"], rec["seed"], rec["key"], row, rounds], default=float)


@pytest.mark.ray
def test_runs_side_by_side_on_ray_equal_the_runs_one_after_another(
    ray_session, tmp_path, capsys
):
    # Prepare: FedDC's Synthetic(0,1) claim, tiny (5 arms, 2 rounds), 2 seeds
    claim = gallery.BY_NAME["feddc-synthetic-01"]
    # Execute: in this process, then as Ray tasks, two at once
    one, _ = gallery.run_claim(claim, 2, True, tmp_path / "one", False)
    two, _ = gallery.run_claim(claim, 2, True, tmp_path / "two", False, workers=2)
    again, _ = gallery.run_claim(claim, 2, True, tmp_path / "two", False, workers=2)
    # Verify: the same records in the same (seed, arm) order, every one run
    # (not cached) the first time and read from the cache the second
    assert [_without_wall_clock(r) for r in two] == [
        _without_wall_clock(r) for r in one
    ]
    assert len(two) == 10 and not any(r["cached"] for r in two)
    assert all(r["cached"] for r in again)
    assert [(r["seed"], r["arm"]) for r in two][:2] == [(0, "fedavg"), (0, "fedprox")]
    out = capsys.readouterr().out
    assert "[10/10] feddc-synthetic-01" in out


def test_a_worker_count_below_zero_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        gallery.main(["--workers", "-1", "--estimate"])
    assert e.value.code == 2
    assert "expected a whole number of workers, 0 or more; got '-1'" in (
        capsys.readouterr().err
    )


def test_a_killed_target_run_resumes_to_the_record_of_one_never_stopped(tmp_path):
    # Prepare: FedAvg on the tiny IID 15% claim, to a target it cannot reach
    # (so every round runs); the "killed" run is the same run ended after 2
    # of its 3 rounds (a resume may extend a run: rounds is not in the
    # fingerprint), its checkpoint left in the work folder
    if not Path(FMNIST).is_file():
        pytest.skip(f"Fashion-MNIST not found at {FMNIST}")
    claim = gallery.BY_NAME["feddc-fmnist-iid-15"]
    arm = next(a for a in claim.arms if a.name == "fedavg")
    base = [o for o in gallery.run_overrides(claim, arm, True) if "rounds=" not in o]
    scenario, label = gallery.ROOT / claim.scenario, arm.label(True)
    work = tmp_path / "work"

    # Execute
    whole, _ = gallery.run_to_target(scenario, label, 0, [*base, "rounds=3"], 0.99)
    _, first = gallery.run_to_target(
        scenario, label, 0, [*base, "rounds=2"], 0.99, work
    )
    kept = (work / "LATEST").read_text().strip()
    resumed, rows = gallery.run_to_target(
        scenario, label, 0, [*base, "rounds=3"], 0.99, work
    )

    # Assert: the resume started from the kept checkpoint (its first rows are
    # the killed run's, measured wall times included: not run again) and
    # ends where the run never stopped ends, to the bit
    assert kept == "ckpt-00000002" and len(rows) == 3
    assert [r["wall_time"] for r in rows[:2]] == [r["wall_time"] for r in first]
    for key in ("final_accuracy", "final_test_loss", "bytes_up", "rounds"):
        assert resumed[key] == whole[key], key
    assert resumed["rounds_to_target"] is None


def test_a_work_folder_of_another_run_is_not_resumed(tmp_path, capsys):
    # Prepare: a checkpoint of seed 0 in the work folder seed 1 is given
    if not Path(FMNIST).is_file():
        pytest.skip(f"Fashion-MNIST not found at {FMNIST}")
    claim = gallery.BY_NAME["feddc-fmnist-iid-15"]
    arm = next(a for a in claim.arms if a.name == "fedavg")
    over = gallery.run_overrides(claim, arm, True)
    scenario, label = gallery.ROOT / claim.scenario, arm.label(True)
    work = tmp_path / "work"
    gallery.run_to_target(scenario, label, 0, over, 0.99, work)

    # Execute
    fresh, _ = gallery.run_to_target(scenario, label, 1, over, 0.99)
    given, _ = gallery.run_to_target(scenario, label, 1, over, 0.99, work)

    # Assert: seed 1 started afresh, saying why, and is seed 1's run
    assert "not resumed, starting afresh" in capsys.readouterr().out
    for key in ("final_accuracy", "final_test_loss", "seed"):
        assert given[key] == fresh[key], key


def test_runs_left_out_refute_only_through_arms_that_ran_every_seed():
    # Prepare: FedDC's Synthetic claim at the paper's setting; FedDC behind
    # FedDyn on all six seeds, or ahead of every arm
    claim = _uncut("feddc-synthetic-01")
    near = {**_BEHIND, "feddyn": _six(0.992), "feddc": _six(0.996)}
    lost = {**near, "feddc": _six(0.82)}
    fedavg_out = [f"fedavg seed {k}" for k in range(6)]

    def judged(values, missing):
        records = [
            r
            for r in _records(claim, values)
            if f"{r['arm']} seed {r['seed']}" not in missing
        ]
        return gallery.verdict(claim, gallery.summarize(claim, records), missing)

    # Execute
    refuted, why = judged(lost, fedavg_out)
    held, held_why = judged(near, fedavg_out)
    # behind FedDyn only, and a seventh FedDyn seed not run: the reversed
    # pair itself could change
    between = {**near, "feddc": _six(0.989)}
    thin, _ = judged(between, ["feddyn seed 6"])

    # Assert: a reversal between arms that ran every seed refutes, naming
    # the runs left out; a "holds" needs every arm; a reversal through an
    # arm with a run left out decides nothing
    assert refuted == "does not hold"
    assert (
        "against the claim: feddc vs feddyn" in why and "not run: fedavg seed 0" in why
    )
    assert held == "inconclusive (reduced: not run: " + ", ".join(fedavg_out) + ")"
    assert "feddc vs fedavg on final test accuracy: fedavg not run" in held_why
    assert thin == "inconclusive (reduced: not run: feddyn seed 6)"
    # the budget's cut still refutes nothing, runs left out or not
    cut = dataclasses.replace(claim, cut="fewer rounds")
    records = [r for r in _records(cut, lost) if r["arm"] != "fedavg"]
    v, _ = gallery.verdict(cut, gallery.summarize(cut, records), fedavg_out)
    assert v.startswith("inconclusive (reduced: fewer rounds; not run: fedavg")


def test_an_until_decided_section_cut_short_by_missing_runs_says_so(tmp_path):
    # Prepare: seeds added until decided, judged from a cache that ran out
    # in the batch of seeds 6 and 7 (--cached-only)
    claim = _uncut("fednova-fig5-full")
    records = _records(claim, {a.name: _six(0.9) for a in claim.arms}, "objective")
    missing = ["fedavg seed 6", "fednova seed 7"]

    # Execute
    def section(left):
        return gallery.claim_section(
            claim,
            records,
            8,
            False,
            tmp_path / "f.png",
            tmp_path / "d.md",
            left,
            (2, 20),
        )

    cut, whole = section(missing), section(())

    # Assert: no "stopped" where the rule did not stop; the cost table still
    # reads the seeds from either
    assert "cut at 8 seeds" in cut and "stopped" not in cut
    assert "it stopped at 8 seeds" in whole
    assert gallery._seeds_of(claim, cut) == gallery._seeds_of(claim, whole) == 8
