"""Client selectors, one module each, and their registry.

A selector is a frozen dataclass (its fields are validated when a scenario is
loaded) deriving from :class:`~fedsim.selectors.base.Selector`:
``init(ctx) -> state``, ``select(state, draw) -> (ids, state)``,
``observe(state, round, result, ctx) -> state``, plus
``multiplicity(state, ids)`` (selectors drawing with replacement) and
``artifact(state, round)`` (rows for ``selector.parquet``). ``ctx`` is the
run's :class:`~fedsim.selectors.base.SelectorContext` (data weights, device
speeds, expected round times); a :class:`~fedsim.selectors.base.Draw` holds
one choice's round, candidates, generator and that context. Adding one: a
module here and its class in ``REGISTRY``; ``tests/test_selectors.py`` runs
every registered selector through the shared contract.

=================== ===========================================================
name                how it picks ``clients_per_round`` online devices
=================== ===========================================================
uniform             uniformly, without replacement (scheme (ii) with
                    ``fedavg sampling: uniform``)
weighted            i.i.d. draws proportional to p_i, with replacement; distinct
                    ids plus multiplicities (scheme (i) with ``sampling:
                    proportional``, the default with this selector)
fedpns              FedPNS probabilities, lowered for nodes the ``fedpns``
                    algorithm labels
power_of_choice     the highest last-seen losses of d candidates drawn by p_i
                    (equal weights, ``sampling: equal``, as its paper)
oort                Oort: loss utility x speed penalty, epsilon exploration
=================== ===========================================================

Each selector declares how it samples (``inclusion``, ``with_replacement``,
``data_share_in_sample``, ``expected_draws``) and the weighting a scenario
gets when it names none (``default_weighting``);
:func:`fedsim.algorithms.sampling.pairing` checks a selector against an
algorithm's weighting, and the scenario refuses the pairs that count the
data share twice (the table is in docs/scenarios.md).
"""

from __future__ import annotations

from fedsim.selectors.base import Draw, Selector, SelectorContext
from fedsim.selectors.fedpns import FedPNS
from fedsim.selectors.oort import Oort
from fedsim.selectors.power_of_choice import PowerOfChoice
from fedsim.selectors.uniform import Uniform
from fedsim.selectors.weighted import Weighted

__all__ = [
    "Draw",
    "FedPNS",
    "Oort",
    "PowerOfChoice",
    "REGISTRY",
    "Selector",
    "SelectorContext",
    "Uniform",
    "Weighted",
    "make_selector",
]

# keyed by each class's ``name`` default, so a name is written once
REGISTRY: dict[str, type[Selector]] = {
    str(cls.name): cls for cls in (Uniform, Weighted, FedPNS, PowerOfChoice, Oort)
}


def make_selector(spec: Selector) -> Selector:
    """The scenario's ``selector`` section is already the selector object."""
    return spec
