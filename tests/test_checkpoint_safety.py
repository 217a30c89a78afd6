"""Checkpoints: a damaged or redirected LATEST, and experiment fingerprints."""

from __future__ import annotations

import json

import pytest

from fedsim.checkpoint import (
    FINGERPRINT,
    CheckpointError,
    check_fingerprint,
    checkpoint_dir,
    commit_checkpoint,
    fingerprint,
    latest_checkpoint,
    write_fingerprint,
    write_meta,
)
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"
TRACE = SCENARIOS / "fleets" / "phones-trace.yaml"
META = {"next_round": 3, "sim_time": 12.5, "n_rows": 3, "n_client_rows": 30}


def make_run(tmp_path, scenario=None):
    """A run folder with one committed checkpoint (round 3)."""
    run = tmp_path / "run"
    ckpt = checkpoint_dir(run, 3)
    ckpt.mkdir(parents=True)
    write_meta(ckpt, META)
    if scenario is not None:
        write_fingerprint(ckpt, fingerprint(scenario))
    commit_checkpoint(run, ckpt)
    return run, ckpt


def test_a_committed_checkpoint_is_found(tmp_path):
    run, ckpt = make_run(tmp_path)
    ck = latest_checkpoint(run)
    assert (ck.path, ck.next_round, ck.sim_time) == (ckpt, 3, 12.5)


# ------------------------------------------------------------------------ LATEST
@pytest.mark.parametrize(
    "content",
    [b"../elsewhere\n", b"/etc\n", b"ckpt-00000003/../../x\n", b"meta.json\n"],
)
def test_latest_pointing_outside_the_run_is_refused(tmp_path, content):
    run, _ = make_run(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (run / "LATEST").write_bytes(content)
    with pytest.raises(CheckpointError, match="LATEST: names .*refusing"):
        latest_checkpoint(run)


def test_latest_through_a_symlink_out_of_the_run_is_refused(tmp_path):
    run, _ = make_run(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    write_meta(outside, META)
    (run / "ckpt-00000009").symlink_to(outside, target_is_directory=True)
    (run / "LATEST").write_text("ckpt-00000009\n")
    with pytest.raises(CheckpointError, match="leads outside the run directory"):
        latest_checkpoint(run)


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"", "it is empty"), (b"\n \n", "it is empty"), (b"\xff\xfe\x00\x81", "not a")],
)
def test_damaged_latest_names_the_file(tmp_path, content, why):
    run, _ = make_run(tmp_path)
    (run / "LATEST").write_bytes(content)
    with pytest.raises(CheckpointError) as exc:
        latest_checkpoint(run)
    assert str(exc.value).startswith(f"{run / 'LATEST'}: damaged ({why}")


def test_huge_latest_is_refused_without_reading_it_all(tmp_path):
    run, _ = make_run(tmp_path)
    (run / "LATEST").write_bytes(b"ckpt-1" + b"0" * 10_000_000)
    with pytest.raises(CheckpointError, match="damaged"):
        latest_checkpoint(run)


def test_binary_meta_is_a_checkpoint_error(tmp_path):
    run, ckpt = make_run(tmp_path)
    (ckpt / "meta.json").write_bytes(b"\xff\x00garbage")
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        latest_checkpoint(run)


def test_missing_latest(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        latest_checkpoint(tmp_path)


# ------------------------------------------------------------------- fingerprint
def test_fingerprint_leaves_out_what_cannot_change_results():
    a = load_scenario(QUICK)
    b = load_scenario(
        QUICK,
        [
            "rounds=7",
            "name=renamed",
            "resources.workers=3",
            "resources.cpus_per_worker=2",
            "checkpoint.every_rounds=1",
        ],
    )
    fp = fingerprint(a)
    assert fp == fingerprint(b)
    assert "rounds" not in fp and "workers" not in fp["resources"]
    assert fp["client"]["lr"] == 0.05 and fp["resources"]["vectorize"] is False


def test_resume_with_the_same_experiment_passes(tmp_path):
    sc = load_scenario(QUICK)
    run, ckpt = make_run(tmp_path, sc)
    check_fingerprint(ckpt, load_scenario(QUICK, ["rounds=100"]))
    check_fingerprint(run, sc)  # a run folder: LATEST is followed


def test_a_checkpoint_of_the_all_in_one_model_spec_names_the_old_fields(tmp_path):
    # Prepare: earlier versions fingerprinted every network's fields
    sc = load_scenario(QUICK)
    run, ckpt = make_run(tmp_path, sc)
    old = json.loads((ckpt / "fingerprint.json").read_text())
    old["model"] |= {"hidden": [200, 200], "width": 128}
    (ckpt / "fingerprint.json").write_text(json.dumps(old))
    # Execute / Assert: refused, each old field named with its value
    with pytest.raises(CheckpointError, match=r"model\.width: 128 \(checkp"):
        check_fingerprint(ckpt, sc)


def test_a_checkpoint_from_before_a_field_was_added_resumes_at_its_default(
    tmp_path,
):
    # Prepare: a checkpoint written before federated evaluation existed (its
    # fingerprint has none of the fields it added)
    run, ckpt = make_run(tmp_path, load_scenario(QUICK))
    fp = json.loads((ckpt / FINGERPRINT).read_text())
    for name in ("federated_every", "federated_clients"):
        del fp["eval"][name]
    del fp["data"]["client_test_fraction"]
    (ckpt / FINGERPRINT).write_text(json.dumps(fp))
    # Execute / Assert: the fields at their defaults change nothing that
    # version computed; one set otherwise is a difference, named
    check_fingerprint(ckpt, load_scenario(QUICK))
    other = load_scenario(
        QUICK, ["eval.federated_every=2", "data.client_test_fraction=0.2"]
    )
    with pytest.raises(CheckpointError) as exc:
        check_fingerprint(ckpt, other)
    msg = str(exc.value)
    assert "eval.federated_every: (absent) (checkpoint) vs 2 (scenario)" in msg
    assert "data.client_test_fraction: (absent) (checkpoint) vs 0.2" in msg
    assert msg.count("(checkpoint)") == 2


def test_resume_with_another_experiment_lists_the_fields(tmp_path):
    # Prepare
    run, ckpt = make_run(tmp_path, load_scenario(QUICK))
    other = load_scenario(QUICK, ["client.lr=0.1", "seed=4"])
    # Execute
    with pytest.raises(CheckpointError) as exc:
        check_fingerprint(ckpt, other)
    # Assert: both fields, with both values, and nothing else
    msg = str(exc.value)
    assert "client.lr: 0.05 (checkpoint) vs 0.1 (scenario)" in msg
    assert "seed: 0 (checkpoint) vs 4 (scenario)" in msg
    assert msg.count("(checkpoint)") == 2


def test_fields_only_on_one_side_are_listed(tmp_path):
    run, ckpt = make_run(tmp_path, load_scenario(QUICK))
    fp = json.loads((ckpt / FINGERPRINT).read_text())
    fp["algorithm"]["invented"] = 1
    (ckpt / FINGERPRINT).write_text(json.dumps(fp))
    with pytest.raises(CheckpointError, match=r"algorithm.invented: 1 .* \(absent\)"):
        check_fingerprint(ckpt, load_scenario(QUICK))


def test_missing_or_damaged_fingerprint(tmp_path):
    sc = load_scenario(QUICK)
    run, ckpt = make_run(tmp_path)
    with pytest.raises(CheckpointError, match="fingerprint.json: missing"):
        check_fingerprint(ckpt, sc)
    check_fingerprint(ckpt, sc, missing_ok=True)
    (ckpt / FINGERPRINT).write_bytes(b"\xff\xfe")
    with pytest.raises(CheckpointError, match="fingerprint.json: unreadable"):
        check_fingerprint(ckpt, sc)


def test_trace_is_fingerprinted_by_content_not_path(tmp_path):
    # Prepare: the same trace under another folder, then an edited copy
    trace_text = (TRACE.parent / "traces" / "phones-example.csv").read_text()
    scen_text = TRACE.read_text()
    for sub, text in (("a", trace_text), ("b", trace_text), ("c", trace_text + "\n")):
        (tmp_path / sub / "traces").mkdir(parents=True)
        (tmp_path / sub / "traces" / "phones-example.csv").write_text(text)
        (tmp_path / sub / "s.yaml").write_text(scen_text)
    fps = [fingerprint(load_scenario(tmp_path / s / "s.yaml")) for s in "abc"]
    # Assert: moved -> same; content changed -> different
    assert fps[0] == fps[1]
    trace = fps[0]["fleet"]["groups"][0]["trace"]
    assert trace["file"] == "phones-example.csv" and len(trace["sha256"]) == 64
    assert fps[2] != fps[0]
