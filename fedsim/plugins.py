"""Finding the class a scenario section names: built-in, installed or by path.

A section's choosing key (``algorithm.name``, ``selector.name``, ``model.name``,
``data.dataset``) is looked up, in this order:

1. the built-in registry of that kind (``fedsim.algorithms.REGISTRY``, ...);
2. the entry points of the kind's group (``fedsim.algorithms``,
   ``fedsim.selectors``, ``fedsim.models``, ``fedsim.datasets``) that installed
   packages declare, so ``name: fedfoo`` finds ``mylab.algos:FedFoo``;
3. ``module:Class``, an import path (the module must be importable: installed,
   or its folder on ``PYTHONPATH``).

The class found must derive from the kind's base (:mod:`fedsim.api`); the rest
of the section is then validated by that class, as a built-in's is. The
section's key keeps the text the user wrote, so the resolved scenario that
``fedsim validate`` prints (and every run folder keeps) loads again to the
same classes.

Example:
    >>> from fedsim.algorithms import FedAvg
    >>> resolve("algorithm", "fedavg") is FedAvg
    True
    >>> resolve("algorithm", "fedsim.algorithms.fedavg:FedAvg") is FedAvg
    True
    >>> resolve("algorithm", "nosuch")
    Traceback (most recent call last):
    ...
    fedsim.plugins.PluginError: unknown name 'nosuch' ...
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import cast

from pydantic import BaseModel, TypeAdapter, ValidationError, ValidationInfo
from pydantic_core import InitErrorDetails


class PluginError(ValueError):
    """A section names a class that cannot be found or is of the wrong kind;
    the message says what was given and what was expected."""


@dataclass(frozen=True)
class Kind:
    """One kind of plug-in: which section key chooses it, where built-ins and
    installed ones are listed, and the base class it must derive from."""

    section: str  # the scenario section ("algorithm")
    key: str  # the key in it that names the class ("name")
    group: str  # the entry-point group of installed plug-ins
    base: str  # "module:Class" of the base, imported when first needed
    registry: str  # "module:NAME" of the built-in registry


KINDS = {
    "algorithm": Kind(
        "algorithm",
        "name",
        "fedsim.algorithms",
        "fedsim.algorithms.base:Algorithm",
        "fedsim.algorithms:REGISTRY",
    ),
    "selector": Kind(
        "selector",
        "name",
        "fedsim.selectors",
        "fedsim.selectors.base:Selector",
        "fedsim.selectors:REGISTRY",
    ),
    "model": Kind(
        "model", "name", "fedsim.models", "fedsim.spec:Model", "fedsim.models:MODELS"
    ),
    "data": Kind(
        "data",
        "dataset",
        "fedsim.datasets",
        "fedsim.data.base:Dataset",
        "fedsim.data:REGISTRY",
    ),
}


def _attr(path: str) -> object:
    """The object at ``module:NAME`` of fedsim itself (imported on first use:
    looking a name up must not import every kind's built-ins)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def builtins(kind: str) -> dict[str, type]:
    """The built-in classes of ``kind`` by name."""
    registry = _attr(KINDS[kind].registry)
    assert isinstance(registry, dict)
    return dict(registry)


def installed(kind: str) -> dict[str, EntryPoint]:
    """Entry points of ``kind``'s group (not loaded), by name."""
    return {ep.name: ep for ep in entry_points(group=KINDS[kind].group)}


@cache
def _import_path(text: str) -> object:
    """The object at ``module:attr`` (cached: a scenario is loaded many times by
    ``compare`` and ``stress``, and a module is imported only once anyway)."""
    module, _, attr = text.partition(":")
    if not module or not attr or not attr.replace(".", "").isidentifier():
        raise PluginError(
            f"{text!r} is not an import path (expected module.path:ClassName)"
        )
    try:
        obj: object = importlib.import_module(module)
    except ImportError as exc:
        # the plug-in's own missing import is named too, not only its module
        raise PluginError(
            f"cannot import module {module!r} of {text!r} ({exc}); is it "
            "installed, or its folder on PYTHONPATH?"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"module {module!r} has no {attr!r} (from {text!r})")
        obj = getattr(obj, part)
    return obj


def resolve(kind: str, name: str) -> type:
    """The class ``name`` stands for in a ``kind`` section.

    Raises:
        PluginError: ``name`` is unknown, does not import, or is not a class
            deriving from the kind's base; the message says which.
    """
    spec = KINDS[kind]
    known = builtins(kind)
    if name in known:
        return known[name]
    if ":" not in name:
        eps = installed(kind)
        if name not in eps:
            choices = ", ".join(sorted({*known, *eps}))
            raise PluginError(
                f"unknown name {name!r} (expected one of {choices}, or an import "
                "path module.path:ClassName)"
            )
        try:
            obj = eps[name].load()
        except Exception as exc:  # noqa: BLE001 - any failure of a plug-in's import
            raise PluginError(
                f"entry point {name!r} ({eps[name].value}) of group "
                f"{spec.group!r} does not load: {type(exc).__name__}: {exc}"
            ) from None
    else:
        obj = _import_path(name)
    base = cast(type, _attr(spec.base))
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise PluginError(
            f"{name!r} is {obj!r}, not a subclass of {base.__module__}."
            f"{base.__qualname__} (a {kind} plug-in derives from it; fedsim.api)"
        )
    return obj


def _named(obj: object, key: str, name: str) -> object:
    """``obj`` with its choosing key set to the text the user wrote."""
    if getattr(obj, key, None) == name:
        return obj
    if dataclasses.is_dataclass(obj):
        # frozen dataclass: set the field without re-running validation, which
        # would hold the import path against a Literal["short"] annotation
        object.__setattr__(obj, key, name)
        return obj
    assert isinstance(obj, BaseModel)  # every other section is a pydantic spec
    return obj.model_copy(update={key: name})


def section_validator(kind: str) -> Callable[[object, ValidationInfo], object]:
    """A pydantic validator for a ``kind`` section: an instance passes as it is;
    a mapping picks its class by the choosing key (the base class's default
    when absent), which then validates the rest of the mapping."""
    spec = KINDS[kind]

    def validate(value: object, info: ValidationInfo) -> object:
        # info.context carries the scenario's folder (relative data paths)
        base = cast(type, _attr(spec.base))
        if isinstance(value, (base, *builtins(kind).values())):
            return value  # already an object (a default, or built in code)
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping ({spec.key}: ..., ...)")
        name = value.get(spec.key, _default_name(kind))
        if not isinstance(name, str):
            raise _field_error(kind, name)
        cls = resolve(kind, name)
        if name in builtins(kind):  # a built-in validates its own name too
            return TypeAdapter(cls).validate_python(value, context=info.context)
        # a plug-in's key holds where it came from, which no field could check
        rest = {k: v for k, v in value.items() if k != spec.key}
        obj: object = TypeAdapter(cls).validate_python(rest, context=info.context)
        return _named(obj, spec.key, name)

    return validate


def _field_error(kind: str, got: object) -> ValidationError:
    """An error at the section's choosing key, worded as pydantic's own: a
    missing name, or one that is not text (an unknown choice)."""
    key = KINDS[kind].key
    line: InitErrorDetails = {"type": "missing", "loc": (key,), "input": got}
    if got is not None:
        expected = ", ".join(
            repr(n) for n in sorted({*builtins(kind), *installed(kind)})
        )
        ctx = {"discriminator": repr(key), "tag": repr(got), "expected_tags": expected}
        line = {"type": "union_tag_invalid", "loc": (key,), "input": got, "ctx": ctx}
    return ValidationError.from_exception_data("plug-in", [line])


def section_names(raw: dict[str, object]) -> list[tuple[str, str, str]]:
    """(kind, field path, name) of each class a raw scenario names, e.g.
    ``("algorithm", "algorithm.name", "mylab.algos:FedFoo")``."""
    out = []
    for kind, spec in KINDS.items():
        section = raw.get(spec.section)
        if isinstance(section, dict) and isinstance(section.get(spec.key), str):
            out.append((kind, f"{spec.section}.{spec.key}", section[spec.key]))
    return out


def _default_name(kind: str) -> object:
    """The section's name when the file leaves it out: the registry's
    ``DEFAULT`` (None where the section has no default)."""
    module = importlib.import_module(KINDS[kind].registry.partition(":")[0])
    return getattr(module, "DEFAULT", None)
