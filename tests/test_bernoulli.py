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


# --------------------------------------------------------- a tiny q (issue 39)


def test_a_q_whose_fleet_would_redraw_for_ever_is_refused_with_the_mean():
    # Prepare: tiny-synthetic's 6 clients; q = 1e-300 redrew for ever in
    # round 0: 1 / (1 - (1 - q)^6) = 1 / (6 q) = 1.67e299 draws on average
    from fedsim.scenario import ScenarioError, load_scenario

    from .conftest import SCENARIOS

    tiny = SCENARIOS / "ci" / "tiny-synthetic.yaml"
    sel = "selector={name: bernoulli, q: %s, clients_per_round: 6}"

    # Execute / Assert: refused, naming the field, the mean and the least q:
    # (1 - q)^6 <= 0.999, q >= 1 - 0.999^(1/6) = 1.6674e-4
    with pytest.raises(ScenarioError) as refused:
        load_scenario(tiny, [sel % "1e-300"])
    said = " ".join(str(refused.value).split())
    assert "selector.q: 1e-300 with 6 clients" in said, said
    assert "on average 1.67e+299 times" in said, said
    assert "use q >= 0.00017 (at most 1000 draws on average)" in said, said
    # just above the bound: 1 / (1 - (1 - 1.67e-4)^6) = 998.4 draws, taken
    assert load_scenario(tiny, [sel % "1.67e-4"]).selector.q == 1.67e-4


def test_few_devices_online_and_a_tiny_q_end_in_one_direct_draw():
    # Prepare: q = 1e-300 (a round needs about 1e300 / m draws), 3 online
    sel, rng = Bernoulli(q=1e-300, clients_per_round=M), np.random.default_rng(0)

    # Execute: 300 rounds, each 100 empty draws and then the direct one
    firsts = np.zeros(3)
    for _ in range(300):
        ids, _ = sel.select({}, _draw([4, 7, 9], rng))
        assert len(ids) == 1  # another active one has probability 2e-300
        firsts[[4, 7, 9].index(int(ids[0]))] += 1

    # Assert: for so small a q the first active client is uniform: chi-square
    # with 2 degrees of freedom below 13.8 (p = 0.001)
    chi2 = float(((firsts - 100) ** 2 / 100).sum())
    assert chi2 < 13.8, firsts


def test_the_direct_draw_has_the_law_of_redrawing_until_one_is_active():
    # Prepare: q = 0.3 over m = 3; each non-empty pattern with k active has
    # probability q^k (1 - q)^(3 - k) / (1 - 0.7^3) = ... / 0.657
    from fedsim.selectors.bernoulli import draw_nonempty

    q, m, n = 0.3, 3, 20_000
    rng = np.random.default_rng(5)
    patterns = [tuple(int(b) for b in f"{i:03b}") for i in range(1, 8)]
    want = np.array([q ** sum(p) * (1 - q) ** (m - sum(p)) / 0.657 for p in patterns])

    # Execute
    seen = np.zeros(len(patterns))
    for _ in range(n):
        mask = draw_nonempty(q, m, rng)
        seen[patterns.index(tuple(int(b) for b in mask))] += 1

    # Assert: chi-square with 6 degrees of freedom below 22.5 (p = 0.001)
    chi2 = float(((seen - n * want) ** 2 / (n * want)).sum())
    assert abs(want.sum() - 1) < 1e-12 and chi2 < 22.5, (seen, n * want)
