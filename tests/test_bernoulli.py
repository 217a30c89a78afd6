"""The Bernoulli participation selector (FedDyn / FedDC protocol): each online
client active with probability q, independently; an empty round redrawn."""

import numpy as np
import pytest

from fedsim.selectors import REGISTRY, Bernoulli, Draw, SelectorContext

M = 20


def _draw(cand, rng) -> Draw:
    return Draw(0, np.asarray(cand), rng, SelectorContext.uniform(M))


def test_it_is_registered():
    assert REGISTRY["bernoulli"] is Bernoulli


def test_inclusion_rate_is_q_over_many_rounds():
    # Prepare: q = 0.3, 20 clients, 4000 rounds; P(empty) = 0.7^20 = 8e-4, so
    # the redraw moves the rate by q (1/(1 - 8e-4) - 1) = 2.4e-4 only
    sel, rng = Bernoulli(q=0.3, clients_per_round=M), np.random.default_rng(7)
    rounds = 4000
    counts = np.zeros(M)
    sizes = []
    # Execute
    for _ in range(rounds):
        ids, _ = sel.select({}, _draw(np.arange(M), rng))
        counts[ids] += 1
        sizes.append(len(ids))
    # Assert: the pooled rate within 4 sigma (sqrt(q(1-q)/(m R)) = 1.6e-3) of
    # q / (1 - (1-q)^m), each client's within 5 sigma (7.2e-3 each)
    expected = 0.3 / (1 - 0.7**M)
    assert abs(counts.sum() / (M * rounds) - expected) < 4 * 1.62e-3
    assert np.all(np.abs(counts / rounds - expected) < 5 * 7.25e-3)
    assert len(set(sizes)) > 3, "the count varies from round to round"


def test_an_empty_draw_is_redrawn_until_one_client_is_active():
    # Prepare: q = 0.01 over two clients: an empty first draw is near certain
    sel, rng = Bernoulli(q=0.01, clients_per_round=2), np.random.default_rng(0)
    # Execute / Assert: never an empty round while a device is online
    for _ in range(50):
        ids, state = sel.select({}, _draw([3, 5], rng))
        assert 1 <= len(ids) <= 2 and set(ids.tolist()) <= {3, 5}
        assert state == {}


def test_no_online_device_gives_an_empty_round():
    ids, _ = Bernoulli(q=0.5).select({}, _draw([], np.random.default_rng(0)))
    assert ids.tolist() == [] and ids.dtype == np.int64


def test_q_one_takes_every_online_client_and_the_cap_holds():
    rng = np.random.default_rng(0)
    ids, _ = Bernoulli(q=1.0, clients_per_round=M).select({}, _draw([1, 4, 9], rng))
    assert ids.tolist() == [1, 4, 9]
    capped, _ = Bernoulli(q=1.0, clients_per_round=2).select({}, _draw([1, 4, 9], rng))
    assert len(capped) == 2 and set(capped.tolist()) <= {1, 4, 9}


def test_q_must_be_a_probability_above_zero():
    from pydantic import TypeAdapter, ValidationError

    with pytest.raises(ValidationError):
        TypeAdapter(Bernoulli).validate_python({"q": 0.0})
