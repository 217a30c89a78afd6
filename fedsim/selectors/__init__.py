"""Client selectors, one module each, and their registry.

A selector is a frozen dataclass (its fields are validated when a scenario is
loaded) with ``init(num_clients) -> state``, ``select(state, round,
candidates, rng) -> (ids, state)`` and ``observe(state, round, result) ->
state``. Adding one: a module here and a line in ``REGISTRY``.
"""

from __future__ import annotations

from fedsim.selectors.uniform import Uniform

__all__ = ["Uniform", "REGISTRY", "make_selector"]

REGISTRY = {"uniform": Uniform}


def make_selector(spec):  # noqa: ANN001, ANN201
    """The scenario's ``selector`` section is already the selector object."""
    return spec
