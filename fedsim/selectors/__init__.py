"""Client selectors, one module each, and their registry.

Adding one: a module here deriving from :class:`~fedsim.selectors.base.Selector`
(the interface, its contract and an example) and its class in ``REGISTRY``;
``tests/test_selectors.py`` runs every registered selector through the
contract. What each does: docs/scenarios.md ("Sampling and weighting").
A ``selector.name`` that is not registered here is looked up among installed
entry points (group ``fedsim.selectors``) and as an import path
(:mod:`fedsim.plugins`).
"""

from __future__ import annotations

from fedsim.selectors.base import Draw, Selector, SelectorContext
from fedsim.selectors.bernoulli import Bernoulli
from fedsim.selectors.bn2 import BN2
from fedsim.selectors.fedpns import FedPNS
from fedsim.selectors.oort import Oort
from fedsim.selectors.power_of_choice import PowerOfChoice
from fedsim.selectors.uniform import Uniform
from fedsim.selectors.weighted import Weighted

__all__ = [
    "DEFAULT",
    "BN2",
    "Bernoulli",
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
    str(cls.name): cls
    for cls in (Uniform, Weighted, FedPNS, PowerOfChoice, Oort, Bernoulli, BN2)
}

# A scenario's selector when it has no ``selector`` section.
DEFAULT = "uniform"


def make_selector(spec: Selector) -> Selector:
    """The scenario's ``selector`` section is already the selector object."""
    return spec
