"""Sampling and weighting as one decision (issue 13): what each selector and
each weighting declares, the scenario check that refuses a double count, the
defaults, and a Monte Carlo estimate of the expected aggregation weights
over the real selector and weighting code."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.algorithms import FedAvg
from fedsim.algorithms.base import ClientUpdate
from fedsim.algorithms.sampling import (
    WEIGHTINGS,
    equal_weights,
    pairing,
    pairing_problem,
    sampling_weights,
)
from fedsim.scenario import ScenarioError, load_scenario
from fedsim.selectors import (
    REGISTRY,
    Draw,
    PowerOfChoice,
    SelectorContext,
    Uniform,
    Weighted,
)

TINY = "scenarios/ci/tiny-synthetic.yaml"

# 30 clients of Zipf sizes n_i = round(1000 i^-0.74): the largest has
# p = 0.1648 (the 0.165); 9 clients a round.
SIZES = np.round(1000 * np.arange(1, 31) ** -0.74).astype(np.int64)
CTX = SelectorContext.from_arrays(SIZES)


def expected_weights(selector, scheme: str, draws: int, seed: int = 0) -> np.ndarray:
    """E[w_i] over ``draws`` rounds: the selector's real ``select`` and
    ``multiplicity``, then the weights FedAvg's ``sampling_weights`` gives."""
    rng = np.random.default_rng(seed)
    state = selector.init(CTX)
    total = np.zeros(CTX.num_clients)
    p = CTX.data_weights
    for t in range(draws):
        if isinstance(selector, PowerOfChoice):  # fresh random losses each round
            state = {"ids": list(range(30)), "loss": rng.random(30).tolist()}
        ids, state = selector.select(state, Draw(t, np.arange(30), rng, CTX))
        k = selector.multiplicity(state, ids) or {}
        ups = [
            ClientUpdate(
                int(i),
                torch.zeros(1),
                float(SIZES[i]),
                1,
                1.0,
                0.0,
                {
                    "multiplicity": torch.tensor(float(k.get(int(i), 1))),
                    "p_m": torch.tensor(p[i] * 30),
                },
            )
            for i in ids
        ]
        total[ids] += sampling_weights(ups, scheme)
    return total / draws


# ------------------------------------------------------------ declarations
def test_each_selector_declares_how_it_samples():
    # Prepare / Execute
    decl = {
        name: (cls.inclusion, cls.with_replacement, cls.data_share_in_sample)
        for name, cls in REGISTRY.items()
    }

    # Assert
    assert decl == {
        "uniform": ("uniform", False, False),
        "weighted": ("proportional", True, True),
        "power_of_choice": ("adaptive", False, True),
        "oort": ("adaptive", False, False),
        "fedpns": ("adaptive", False, False),
        # a random count: no fixed-k formula fits (sampling: uniform refused)
        "bernoulli": ("adaptive", False, False),
        "bn2": ("adaptive", False, False),
    }
    ctx = SelectorContext.from_arrays([1, 3])  # p = (0.25, 0.75)
    # uniform: q/m = 1/2 each; weighted: q p_i = (0.5, 1.5) draws a round
    assert Uniform(clients_per_round=1).expected_draws(ctx).tolist() == [0.5, 0.5]
    assert Weighted(clients_per_round=2).expected_draws(ctx).tolist() == [0.5, 1.5]
    assert PowerOfChoice(clients_per_round=1).expected_draws(ctx) is None


def test_each_weighting_declares_what_it_assumes():
    assert {k: w.assumes for k, w in WEIGHTINGS.items()} == {
        "renormalized": None,
        "uniform": "uniform",
        "proportional": "proportional",
        "equal": "proportional",
    }
    assert equal_weights(4) == [0.25] * 4
    with pytest.raises(ValueError, match="positive"):
        equal_weights(0)


@pytest.mark.parametrize(
    ("selector", "scheme", "verdict"),
    [
        ("uniform", "renormalized", "biased"),
        ("uniform", "uniform", "unbiased"),
        ("uniform", "proportional", "refused"),
        ("uniform", "equal", "biased"),
        ("weighted", "renormalized", "refused"),
        ("weighted", "uniform", "refused"),
        ("weighted", "proportional", "unbiased"),
        ("weighted", "equal", "refused"),
        ("power_of_choice", "renormalized", "refused"),
        ("power_of_choice", "uniform", "refused"),
        ("power_of_choice", "proportional", "refused"),
        ("power_of_choice", "equal", "adaptive"),
        ("oort", "renormalized", "adaptive"),
        ("oort", "equal", "adaptive"),
        ("oort", "uniform", "refused"),
        ("fedpns", "renormalized", "adaptive"),
    ],
)
def test_the_pairing_table(selector, scheme, verdict):
    # the table of docs/scenarios.md
    assert pairing(REGISTRY[selector](), scheme).verdict == verdict


# ------------------------------------------------------- the scenario check
@pytest.mark.parametrize(
    ("selector", "algorithm", "use"),
    [
        ("weighted", "fedavg", "proportional"),
        ("power_of_choice", "fedavg", "equal"),
        ("power_of_choice", "fednova", "equal"),
        ("weighted", "fedprox", "proportional"),
    ],
)
def test_a_double_count_is_refused_with_one_message_naming_both_fields(
    selector, algorithm, use
):
    # Prepare
    overrides = [
        f"selector={{name: {selector}, clients_per_round: 3}}",
        f"algorithm={{name: {algorithm}, sampling: renormalized}}",
    ]

    # Execute
    with pytest.raises(ScenarioError) as err:
        load_scenario(TINY, overrides)

    # Assert: one problem, both fields, the unbiased choice
    msg = str(err.value)
    assert "(1 problem)" in msg
    assert f"selector.name: '{selector}'" in msg
    assert "algorithm.sampling 'renormalized'" in msg
    assert f"use algorithm.sampling '{use}'" in msg
    assert "counts twice" in msg


def test_the_unbiased_pairing_is_the_default_and_uniform_is_unchanged():
    # Execute
    weighted = load_scenario(TINY, ["selector={name: weighted, clients_per_round: 3}"])
    pow_d = load_scenario(
        TINY,
        [
            "selector={name: power_of_choice, clients_per_round: 3}",
            "algorithm={name: fednova}",
        ],
    )
    uniform = load_scenario(TINY)
    explicit = load_scenario(
        TINY,
        [
            "selector={name: weighted, clients_per_round: 3}",
            "algorithm={name: fedavg, sampling: proportional}",
        ],
    )

    # Assert
    assert weighted.algorithm.sampling == "proportional"
    assert pow_d.algorithm.sampling == "equal"
    assert uniform.selector.name == "uniform"
    assert uniform.algorithm == FedAvg()  # renormalized, as before
    assert explicit.algorithm == weighted.algorithm
    # algorithms whose weights are their own are left alone
    sc = load_scenario(
        TINY,
        [
            "selector={name: weighted, clients_per_round: 3}",
            "algorithm={name: scaffold}",
        ],
    )
    assert pairing_problem(sc.selector, sc.algorithm) is None


def test_every_shipped_scenario_still_loads():
    from .conftest import SCENARIOS  # absolute: whatever pytest's directory

    loaded = []
    for path in sorted(SCENARIOS.rglob("*.yaml")):
        if "fleets/traces" in str(path) or path.parent.name == "traces":
            continue
        text = path.read_text()
        if "rounds:" not in text:  # a fleet fragment, not a scenario
            continue
        load_scenario(path)
        loaded.append(path.relative_to(SCENARIOS).as_posix())
    # the loop ran over the shipped scenarios, not over nothing
    assert len(loaded) >= 20 and "quickstart.yaml" in loaded, loaded


# ----------------------------------------------------------- Monte Carlo
def test_monte_carlo_the_double_count_against_the_unbiased_pairing():
    # Prepare: 30 Zipf-sized clients, 9 draws a round, 5000 rounds
    p = CTX.data_weights
    assert p.max() == pytest.approx(0.165, abs=0.001)
    sel = Weighted(clients_per_round=9)

    # Execute
    refused = expected_weights(sel, "renormalized", 5000)
    unbiased = expected_weights(sel, "proportional", 5000)

    # Assert: n_i weights over a p-proportional sample put the largest
    # client near 0.33 against p = 0.165 (measured 0.332 over 10^4 rounds)
    # and the L1 distance near 0.49; k_i / q is unbiased: E[k_i / q] = p_i,
    # so only Monte Carlo noise is left (0.017 over 10^4 rounds)
    assert refused[0] == pytest.approx(0.33, abs=0.02)
    assert np.abs(refused - p).sum() == pytest.approx(0.49, abs=0.04)
    assert unbiased[0] == pytest.approx(p[0], abs=0.01)
    assert np.abs(unbiased - p).sum() < 0.05
    assert unbiased.sum() == pytest.approx(1.0)


def test_monte_carlo_uniform_scheme_ii_is_unbiased_and_the_default_is_not():
    # Prepare
    p = CTX.data_weights
    sel = Uniform(clients_per_round=9)

    # Execute
    default = expected_weights(sel, "renormalized", 3000)
    scheme_ii = expected_weights(sel, "uniform", 3000)

    # Assert: E[p_i m / q 1{i in S}] = p_i; renormalised n_i weights
    # under-weight the largest client (0.127 against 0.165 over 10^4 rounds)
    assert np.abs(scheme_ii - p).sum() < 0.05
    assert default[0] == pytest.approx(0.127, abs=0.01)
    assert np.abs(default - p).sum() > 0.08


def test_a_name_that_is_not_a_string_is_a_scenario_error_not_a_crash():
    # the default-weighting step runs before validation, on the raw YAML
    for override in (
        "selector={name: [1], clients_per_round: 3}",
        "algorithm={name: {a: 1}}",
    ):
        with pytest.raises(ScenarioError, match="unknown choice"):
            load_scenario(TINY, [override])
