"""The batched executor with the FedDC/FedDyn codes' client settings equals
sequential training: gradient clipping per client (a norm per row inside the
stack), coupled weight decay, the round's learning-rate decay and step
schedule, and the stateful client terms (SCAFFOLD's control variates, FedDyn's
and FedDC's drift corrections), all at once, in float64.
"""

from __future__ import annotations

import pytest
import torch

from fedsim.batched import clip_rows, train_batched, why_not_batched
from fedsim.solvers import clip_gradient
from fedsim.workers import Task

from .test_batched import assert_equal_updates, start_state, worker

# clip 0.05 binds on some steps of the 3 clients and not on others (checked
# below), so both branches of the clip are compared
FEDDC_LIKE = [
    "model={name: mlp, hidden: [16, 8], dtype: float64}",
    "client.clip_norm=0.05",
    "client.weight_decay=0.001",
    "client.lr=0.1",
    "client.lr_decay=0.9",
    "client.lr_steps=[0.05]",  # x0.1 from round 2 of the scenario's 40
    "client.batch_size=20",
]
ALGORITHMS = ["fedavg", "fedprox", "scaffold", "feddyn", "feddc"]
TAUS = [(0, 3), (4, 1), (9, 5)]


def test_clip_rows_equals_clip_gradient_row_by_row():
    # Prepare: rows above, at and below the bound
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    g[1] *= 1e-3
    g[2] = 0.0
    expected = torch.stack([clip_gradient(row, 0.5) for row in g])
    # Execute
    clip_rows(g, 0.5)
    # Assert
    torch.testing.assert_close(g, expected, rtol=1e-14, atol=0)
    assert float(torch.linalg.vector_norm(g[0])) == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_clipped_decayed_stateful_training_is_batched_and_equal(algorithm):
    # Prepare
    label = "fedprox, mu: 0.1" if algorithm == "fedprox" else algorithm
    w, server = worker(*FEDDC_LIKE, f"algorithm={{name: {label}}}")
    assert why_not_batched(w) is None  # clipping no longer falls back
    payload, states = start_state(w, server)
    for r in (0, 3):  # round 3: lr 0.1 x 0.9^3 x 0.1 (decay and step)
        tasks = [Task(c, r, tau) for c, tau in TAUS]
        # Execute
        seq = w.train_sequential(payload, tasks, states)
        bat = train_batched(w, payload, tasks, states)
        # Assert
        assert_equal_updates(seq, bat, rtol=1e-9, atol=1e-10)
        assert w.solver_for(r).lr == pytest.approx(0.1 * 0.9**r * (0.1 if r else 1))
        states = {**states, **{u.client: u.new_state for u in seq if u.new_state}}
        mean = torch.stack([u.delta for u in seq]).mean(0)
        payload = {**payload, "x": payload["x"] + mean}


def test_the_clip_binds_in_the_equality_test():
    # without the clip the same tasks give other updates: the test above
    # compares clipped steps, not a bound that never binds
    w, server = worker(*FEDDC_LIKE, "algorithm={name: feddc}")
    free, _ = worker(*FEDDC_LIKE, "client.clip_norm=100", "algorithm={name: feddc}")
    payload, states = start_state(w, server)
    tasks = [Task(c, 0, tau) for c, tau in TAUS]
    clipped = train_batched(w, payload, tasks, states)
    unclipped = train_batched(free, payload, tasks, states)
    gaps = [
        float((a.delta - b.delta).norm())
        for a, b in zip(clipped, unclipped, strict=True)
    ]
    assert max(gaps) > 1e-3


def test_float32_clipped_feddc_matches_within_tolerance():
    # the scenario's dtype: the per-row norm is float32, the sequential
    # clip's coefficient a Python float; equal within float32 tolerance
    over = [o for o in FEDDC_LIKE if "dtype" not in o]
    w, server = worker(
        *over, "model={name: mlp, hidden: [16, 8]}", "algorithm={name: feddc}"
    )
    payload, states = start_state(w, server)
    tasks = [Task(c, 1, tau) for c, tau in [(0, 7), (4, 1), (9, 12), (17, 5)]]
    seq = w.train_sequential(payload, tasks, states)
    bat = train_batched(w, payload, tasks, states)
    assert_equal_updates(seq, bat, rtol=1e-4, atol=1e-6)


def test_a_clipped_plain_rule_without_weight_decay_is_clipped_and_equal():
    # Without weight decay or a gradient hook, a plain SGD step on a dense
    # stack could take the fused path (the step inside the backward pass);
    # every case above sets weight decay, so none of them reaches it.
    # Prepare: FedAvg, the clip of the cases above, no weight decay
    plain = [o for o in FEDDC_LIKE if "weight_decay" not in o]
    w, server = worker(*plain, "algorithm={name: fedavg}")
    free, _ = worker(*plain, "client.clip_norm=100", "algorithm={name: fedavg}")
    solver = w.solver_for(0)
    assert solver.plain and not solver.weight_decay and solver.clip_norm == 0.05
    payload, states = start_state(w, server)
    tasks = [Task(c, 0, tau) for c, tau in TAUS]

    # Execute
    seq = w.train_sequential(payload, tasks, states)
    bat = train_batched(w, payload, tasks, states)
    unclipped = train_batched(free, payload, tasks, states)

    # Assert: clipped as sequential training clips, and the clip binds
    assert_equal_updates(seq, bat, rtol=1e-9, atol=1e-10)
    gaps = [
        float((a.delta - b.delta).norm()) for a, b in zip(bat, unclipped, strict=True)
    ]
    assert max(gaps) > 1e-3
