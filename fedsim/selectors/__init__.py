"""Client selectors, one module each, and the registry that builds them."""

from __future__ import annotations

from fedsim.selectors.uniform import Uniform

__all__ = ["Uniform", "REGISTRY", "make_selector"]

REGISTRY = {"uniform": Uniform}


def make_selector(spec):  # noqa: ANN001, ANN201 - any SelectorSpec
    """Build the selector a scenario's ``selector`` section describes."""
    fields = spec.model_dump()
    return REGISTRY[fields.pop("name")](**fields)
