"""Compressed updates on the clock (fedsim/compression.py, docs/fleets.md
"Compressed updates"):

- each built-in compresses as its paper says, and error feedback keeps
  exactly what was left out;
- a top-k run uploads the bytes computed here by hand, and the clock
  charges them: on the phones fleet, compression lets devices that had no
  time for a step contribute (tau and clients.parquet);
- every aggregator runs with it, the batched executor too, sync and async;
  the residual lives in the client store and a resumed run equals an
  uninterrupted one; 0 and 2 Ray workers agree;
- bad input is refused before training, naming the field.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from fedsim import compression
from fedsim.algorithms import REGISTRY
from fedsim.compression import (
    QSGD,
    Compressor,
    RandomK,
    Sign,
    TopK,
    compress_update,
    compression_generator,
    top_k_indices,
    upload_bytes,
)
from fedsim.runtime import SetupError, _Run, run_scenario
from fedsim.scenario import ScenarioError, load_scenario

from .conftest import SCENARIOS
from .test_async_sim import FEDBUFF, _Stop, _stop_after, same_run
from .test_contract import NOT_DELTA, TINY_ARGS
from .test_feddm import TINY

EF = "compression={name: top_k, fraction: 0.1, error_feedback: true}"
PHONES = SCENARIOS / "stress" / "phones-stragglers.yaml"


def _run(sc, **kw):
    res = run_scenario(sc, **{"workers": 0, **kw})
    assert res.status == "completed", res.message
    return res


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------- compressors
def test_top_k_keeps_the_largest_entries_and_bills_values_and_indices():
    v = torch.tensor([0.5, -4.0, 0.1, 3.0, -0.2, 1.0])
    assert TopK(k=2).compress(v, _gen()).tolist() == [0, -4.0, 0, 3.0, 0, 0]
    # ceil(0.5 * 6) = 3 entries
    assert TopK(fraction=0.5).compress(v, _gen()).tolist() == [0, -4, 0, 3, 0, 1]
    assert TopK(k=2).wire_bytes(6, elem_bytes=4) == 2 * (4 + 4)
    assert TopK(fraction=0.01).wire_bytes(1000, elem_bytes=8) == 10 * (8 + 4)


def test_random_k_keeps_k_entries_drawn_from_the_generator_and_sends_a_seed():
    v = torch.arange(1.0, 101.0)
    a = RandomK(k=7).compress(v, _gen(3))
    b = RandomK(k=7).compress(v, _gen(3))
    kept = torch.nonzero(a).flatten()
    assert kept.numel() == 7 and torch.equal(a[kept], v[kept]) and torch.equal(a, b)
    assert not torch.equal(a, RandomK(k=7).compress(v, _gen(4)))
    assert RandomK(k=7).wire_bytes(100, elem_bytes=4) == 7 * 4 + 8


def test_qsgd_is_unbiased_on_its_levels_and_bills_bits_plus_a_norm():
    v = torch.tensor([0.3, -1.2, 0.0, 2.5], dtype=torch.float64)
    q = QSGD(bits=2)
    draws = torch.stack([q.compress(v, _gen(s)) for s in range(4000)])
    # each entry is sign * level * ||v|| / 3, a level of 0..3
    levels = draws.abs() / torch.linalg.vector_norm(v) * 3
    assert torch.allclose(levels, levels.round(), atol=1e-9)
    assert levels.max() <= 3
    assert torch.allclose(draws.mean(0), v, atol=0.05)  # unbiased
    assert q.wire_bytes(1000, elem_bytes=4) == math.ceil(1000 * 3 / 8) + 4
    assert q.compress(torch.zeros(3), _gen()).tolist() == [0, 0, 0]


def test_sign_sends_the_signs_and_the_mean_magnitude():
    v = torch.tensor([1.0, -3.0, 0.0, 2.0])
    assert Sign().compress(v, _gen()).tolist() == [1.5, -1.5, 0.0, 1.5]
    assert Sign().wire_bytes(17, elem_bytes=4) == 3 + 4


def test_error_feedback_keeps_exactly_what_was_left_out():
    comp = TopK(k=1, error_feedback=True)
    first = compress_update(comp, torch.tensor([3.0, 2.0]), None, _gen())
    assert first.delta.tolist() == [3.0, 0.0]
    assert first.residual is not None and first.residual.tolist() == [0.0, 2.0]
    # the next update plus the residual: the left-out 2 wins now
    second = compress_update(comp, torch.tensor([0.5, 0.5]), first.residual, _gen())
    assert second.delta.tolist() == [0.0, 2.5]
    assert second.residual is not None and second.residual.tolist() == [0.5, 0.0]
    plain = compress_update(TopK(k=1), torch.tensor([3.0, 2.0]), None, _gen())
    assert plain.residual is None


def _topk_set(a, k):
    return set(torch.topk(a, k, sorted=False).indices.tolist())


def test_top_k_picks_the_set_torch_topk_picks_on_its_fast_path_and_off_it(
    monkeypatch,
):
    # Prepare: large enough for the fast path (k * 64 <= d), and the cases
    # it hands back to torch.topk: a tie at the k-th value (torch's heap
    # decides which tied entry), a NaN (torch ranks it first) and a strided
    # sample that overestimates the threshold (every 16th entry large)
    gen = _gen(5)
    d, k = 64_000, 640
    plain = torch.randn(d, generator=gen).abs()
    tied = plain.clone()
    kth = torch.topk(plain, k).values[-1]
    tied[(plain < kth).nonzero()[0]] = kth  # one more entry at the k-th value
    nan = plain.clone()
    nan[12345] = float("nan")
    strided = torch.rand(d, generator=gen)
    strided[::16] += 10.0

    # Execute and assert: the same set, k distinct entries, every time
    for a in (plain, tied, nan, strided, torch.zeros(d)):
        got = top_k_indices(a, k).tolist()
        assert len(got) == k and set(got) == _topk_set(a, k)
    assert 12345 in top_k_indices(nan, k).tolist()
    # the plain case takes the fast path: no heap over all d entries
    expected, heaps = _topk_set(plain, k), []
    lazy = compression.torch  # the module's own (lazy) torch keeps attributes
    topk = lazy.topk
    topk = lazy.topk

    def counted(*args, **kw):
        heaps.append(args)
        return topk(*args, **kw)

    monkeypatch.setattr(lazy, "topk", counted)
    assert set(top_k_indices(plain, k).tolist()) == expected and not heaps


def test_the_upload_replaces_one_dense_vector_and_the_generator_is_per_client():
    assert upload_bytes(None, 800, 100, 4) == 800
    assert upload_bytes(TopK(k=10), 2 * 400, 100, 4) == 400 + 80  # SCAFFOLD: c dense
    a = torch.rand(3, generator=compression_generator(11))
    assert torch.equal(a, torch.rand(3, generator=compression_generator(11)))
    assert not torch.equal(a, torch.rand(3, generator=compression_generator(12)))


# ------------------------------------------------------------- on the clock
def test_a_top_k_run_uploads_the_bytes_computed_by_hand():
    # Prepare: logreg on 10 features and 3 classes: d = 10 * 3 + 3 = 33;
    # top 10%: ceil(3.3) = 4 float32 values and 4 int32 indices = 32 bytes
    sc = load_scenario(TINY, ["rounds=2", EF])

    # Execute
    res = _run(sc)

    # Assert: every update that arrived, and the clock's context
    up = {c["bytes_up"] for c in res.clients if not c["dropped"]}
    assert up == {4 * (4 + 4)}
    assert {c["bytes_down"] for c in res.clients} == {33 * 4}
    assert _Run(sc, None, None).ctx.bytes_up == 32


def test_on_the_phones_fleet_compression_lets_more_devices_make_the_window():
    # Prepare: a 1.4M-parameter MLP (5.7 MB an update) in an 8 s window:
    # on the slower links, the upload leaves no time for a step
    over = [
        "rounds=2",
        "model={name: mlp, hidden: [20000]}",
        "round.window_s=8",
        "eval.every_rounds=100",
    ]
    dense = _run(load_scenario(PHONES, over))

    # Execute
    sparse = _run(
        load_scenario(
            PHONES,
            [*over, "compression={name: top_k, fraction: 0.01, error_feedback: true}"],
        )
    )

    # Assert: the same devices (common random numbers); each does at least
    # the steps it did, more in all, and those without time now contribute
    pairs = list(zip(dense.clients, sparse.clients, strict=True))
    assert all(a["client_id"] == b["client_id"] for a, b in pairs)
    assert all(b["tau"] >= a["tau"] for a, b in pairs if not b["dropped"])
    assert sum(b["tau"] for _, b in pairs) > sum(a["tau"] for a, _ in pairs)
    reasons = [Counter(c["drop_reason"] for c in r.clients) for r in (dense, sparse)]
    assert reasons[0]["no_time"] > 0 and reasons[1]["no_time"] == 0
    assert sum(r["tau_mean"] for r in sparse.rows) > sum(
        r["tau_mean"] for r in dense.rows
    )
    assert max(c["bytes_up"] for c in sparse.clients) < 0.03 * max(
        c["bytes_up"] for c in dense.clients
    )


# ------------------------------------------------------------- every rule
@pytest.mark.parametrize("name", sorted(set(REGISTRY) - set(NOT_DELTA)))
def test_every_aggregator_runs_on_compressed_updates(name):
    args = f", {TINY_ARGS[name]}" if name in TINY_ARGS else ""
    sc = load_scenario(TINY, [f"algorithm={{name: {name}{args}}}", "rounds=2", EF])
    res = _run(sc)
    assert all(math.isfinite(r["train_loss"]) for r in res.rows)
    d, extra = 33, sc.algorithm.up_factor - 1
    done = [c for c in res.clients if not c["dropped"]]
    assert {c["bytes_up"] for c in done} == {32 + extra * d * 4}


def test_the_batched_executor_compresses_too():
    over = ["rounds=3", "resources.vectorize=true", EF]
    batched = _run(load_scenario(TINY, over))
    one_by_one = _run(load_scenario(TINY, over[:1] + over[2:]))
    # equal within float tolerance, as batched training is
    assert torch.allclose(batched.final_params, one_by_one.final_params, atol=1e-5)
    up = {c["bytes_up"] for c in batched.clients if not c["dropped"]}
    assert up == {32}


# ------------------------------------------------------------- state, resume
def test_the_residual_is_kept_in_the_client_store():
    sc = load_scenario(TINY, ["rounds=2", EF])
    run = _Run(sc, None, None)
    assert run.setup.server.keeps_states
    plain = _Run(load_scenario(TINY, ["rounds=2"]), None, None)
    assert not plain.setup.server.keeps_states


@pytest.mark.parametrize(
    ("scenario", "over", "stop_at"),
    [
        (TINY, ["rounds=6", EF], 3),
        (FEDBUFF, ["rounds=20", "compression={name: qsgd, bits: 3}"], 11),
        (TINY, ["rounds=5", "compression={name: qsgd, bits: 2}"], 2),
    ],
    ids=["sync-ef", "async-qsgd", "sync-qsgd"],
)
def test_a_resumed_compressed_run_equals_an_uninterrupted_one(
    tmp_path, scenario, over, stop_at
):
    # Prepare: checkpoints every 2 steps, stopped after step stop_at
    sc = load_scenario(scenario, [*over, "checkpoint.every_rounds=2"])
    ref = _run(sc)
    with pytest.raises(_Stop):
        run_scenario(sc, run_dir=tmp_path, on_round=_stop_after(stop_at))

    # Execute
    res = _run(sc, run_dir=tmp_path, resume=True)

    # Assert: the residuals came back with the checkpoint
    same_run(res, ref)


def test_error_feedback_changes_the_run():
    # (the residual is used: without it the same top-k gives another model)
    with_ef = _run(load_scenario(TINY, ["rounds=4", EF]))
    without = _run(
        load_scenario(TINY, ["rounds=4", "compression={name: top_k, fraction: 0.1}"])
    )
    assert not torch.equal(with_ef.final_params, without.final_params)


@pytest.mark.ray
def test_zero_and_two_ray_workers_agree_on_a_compressed_run(ray_session):
    qsgd = "compression={name: qsgd, bits: 3}"
    for scenario, over in ((TINY, ["rounds=3", EF]), (FEDBUFF, ["rounds=8", qsgd])):
        sc = load_scenario(scenario, over)
        local, two = _run(sc), _run(sc, workers=2)
        same_run(local, two)


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("compression={name: qsgd, bits: 0}", "compression.bits"),
        ("compression={name: top_k}", "give k or fraction"),
        ("compression={name: top_k, k: 3, fraction: 0.1}", "give k or fraction"),
        ("compression={name: top_k, fraction: 1.5}", "compression.fraction"),
        ("compression={name: nosuch}", "compression.name"),
        ("compression={name: top_k, k: 0}", "compression.k"),
    ],
)
def test_a_bad_compression_section_is_refused_naming_the_field(setting, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(TINY, [setting])
    assert words in str(err.value)


def test_a_compressed_download_is_refused_and_a_dense_one_accepted():
    # the broadcast is billed dense; asking for more is one line, not a
    # silent dense download
    with pytest.raises(ScenarioError, match="compression.download: compressing"):
        load_scenario(TINY, ["compression={name: top_k, k: 3, download: true}"])
    sc = load_scenario(TINY, ["compression={name: top_k, k: 3, download: false}"])
    assert sc.compression.download is False


def test_k_above_the_model_is_refused_before_training():
    sc = load_scenario(TINY, ["compression={name: top_k, k: 34}"])  # d = 33
    with pytest.raises(SetupError, match=r"compression.k: 34 is larger than the model"):
        run_scenario(sc, workers=0)
    load_scenario(TINY, ["compression={name: top_k, k: 33}"])  # d itself: fine


def test_error_feedback_is_refused_in_asynchronous_runs():
    with pytest.raises(ScenarioError, match="error_feedback: needs synchronous rounds"):
        load_scenario(FEDBUFF, [EF])


def test_a_rule_that_needs_dense_uploads_refuses_a_compressor():
    args = TINY_ARGS["feddm"]
    with pytest.raises(ScenarioError, match="feddm.*does not upload a model update"):
        load_scenario(TINY, [f"algorithm={{name: feddm, {args}}}", EF])


def test_a_users_compressor_by_import_path():
    sc = load_scenario(
        TINY, ["rounds=2", "compression={name: tests.test_compression:Halve}"]
    )
    res = _run(sc)
    assert {c["bytes_up"] for c in res.clients if not c["dropped"]} == {33 * 2}


class Halve(Compressor):
    """A user's compressor: float16 values, as they are (two bytes each)."""

    def compress(self, v, gen):
        return v.half().to(v.dtype)

    def wire_bytes(self, d, elem_bytes):
        return 2 * d
