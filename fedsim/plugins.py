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
import difflib
import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import cast

from pydantic import (
    BaseModel,
    PydanticSchemaGenerationError,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import InitErrorDetails, to_jsonable_python

from fedsim.errors import LoadError


class PluginError(LoadError, ValueError):
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
    # the hooks a plug-in must define (the base's raise NotImplementedError)
    required: tuple[str, ...] = ()
    # "module:function" naming what is left of an older form of the kind's
    # interface in a class (one line), or None; "" where none was removed
    outdated: str = ""


KINDS = {
    "algorithm": Kind(
        "algorithm",
        "name",
        "fedsim.algorithms",
        "fedsim.algorithms.base:Algorithm",
        "fedsim.algorithms:REGISTRY",
        ("aggregate",),
        "fedsim.algorithms.base:outdated_form",
    ),
    "selector": Kind(
        "selector",
        "name",
        "fedsim.selectors",
        "fedsim.selectors.base:Selector",
        "fedsim.selectors:REGISTRY",
        ("select",),
    ),
    "model": Kind(
        "model",
        "name",
        "fedsim.models",
        "fedsim.spec:Model",
        "fedsim.models:MODELS",
        ("build",),
    ),
    "data": Kind(
        "data",
        "dataset",
        "fedsim.datasets",
        "fedsim.data.base:Dataset",
        "fedsim.data:REGISTRY",
        ("build",),
    ),
    "compression": Kind(
        "compression",
        "name",
        "fedsim.compressors",
        "fedsim.compression:Compressor",
        "fedsim.compression:REGISTRY",
        ("compress", "wire_bytes"),
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
    except ModuleNotFoundError as exc:
        # the plug-in's own missing import is named too, not only its module
        raise PluginError(
            f"cannot import module {module!r} of {text!r} ({exc}); is it "
            "installed, or its folder on PYTHONPATH?"
        ) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the plug-in's code
        raise PluginError(
            f"module {module!r} of {text!r} raised while imported: "
            f"{_failure(exc, module)}"
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
            names = sorted({*known, *eps})
            raise PluginError(
                f"unknown name {name!r} ({did_you_mean(name, names)}expected one "
                f"of {', '.join(names)}, or an import path module.path:ClassName)"
            )
        try:
            obj = eps[name].load()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a plug-in's import
            raise PluginError(
                f"entry point {name!r} ({eps[name].value}) of group "
                f"{spec.group!r} does not load: "
                f"{_failure(exc, eps[name].module)}"
            ) from None
    else:
        obj = _import_path(name)
    base = cast(type, _attr(spec.base))
    where = f"fedsim.api.{base.__qualname__}"  # where users import it from
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise PluginError(
            f"{name!r} is {obj!r}, not a subclass of {where} ({_a(kind)} plug-in "
            "derives from it)"
        )
    # fedsim.api:Algorithm itself, or a subclass that leaves a hook to its
    # base, would train until the hook raises NotImplementedError
    missing = [h for h in spec.required if getattr(obj, h) is getattr(base, h)]
    if obj is base or missing or inspect.isabstract(obj):
        hooks = ", ".join(missing) or "its abstract methods"
        raise PluginError(
            f"{name!r} is abstract: {obj.__qualname__} does not define {hooks} "
            f"({_a(kind)} plug-in is a subclass of {where} that defines "
            f"{', '.join(spec.required)})"
        )
    _refuse_outdated(spec, name, obj)
    return obj


def _refuse_outdated(spec: Kind, name: str, cls: type) -> None:
    """Refuse a class written for an earlier fedsim (``spec.outdated``).

    Raises:
        PluginError: naming ``name``, the old form and what replaced it.
    """
    if not spec.outdated:
        return
    outdated = cast(Callable[[type], str | None], _attr(spec.outdated))
    if line := outdated(cls):
        raise PluginError(f"{name!r}: {line}")


def _a(kind: str) -> str:
    """``kind`` with its article: "an algorithm", "a selector"."""
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ "did you mean 'x'? " for the known names closest to a mistyped
    ``name`` (difflib's ratio of at least 0.6), or "" when none is close.

    >>> did_you_mean("fedprx", ["fedavg", "fedprox", "scaffold"])
    "did you mean 'fedprox'? "
    >>> did_you_mean("zzz", ["fedavg"])
    ''
    """
    close = difflib.get_close_matches(name, list(known), n=2)
    if not close:
        return ""
    return f"did you mean {' or '.join(repr(c) for c in close)}? "


def _failure(exc: BaseException, module: str) -> str:
    """One line for an exception a plug-in module raised while imported:
    the exception and the plug-in's own file:line where it was raised (the
    last frame in the module's top-level package; else the last frame
    outside Python's import machinery), not the traceback's 60 lines."""
    if isinstance(exc, SystemExit):
        what = f"SystemExit({exc.code!r}) (sys.exit at import)"
    elif isinstance(exc, SyntaxError) and exc.filename:
        # raised by the compiler: no frame of the plug-in's own, the file's
        # name and line are the exception's
        return f"SyntaxError: {exc.msg} (at {exc.filename}:{exc.lineno})"
    else:
        what = f"{type(exc).__name__}: {exc}".strip()
    frames = traceback.extract_tb(exc.__traceback__)
    top = module.partition(".")[0]
    home = _package_folder(top)
    own = [f for f in frames if home is not None and _within(f.filename, home)]
    outside = [f for f in frames if not f.filename.startswith("<frozen")]
    found = own or outside
    if not found:
        return what
    return f"{what} (at {found[-1].filename}:{found[-1].lineno})"


def _package_folder(top: str) -> Path | None:
    """The folder of top-level package ``top`` (its file, for a module), or
    None when it cannot be found (it is then not the plug-in's)."""
    mod = sys.modules.get(top)
    try:
        spec = mod.__spec__ if mod is not None else importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    return origin.parent if spec.submodule_search_locations else origin


def _within(filename: str, home: Path) -> bool:
    """Whether ``filename`` is ``home`` or lies inside it."""
    path = Path(filename).resolve()
    return path == home or home in path.parents


def _named(obj: object, key: str, name: str) -> object:
    """``obj`` with its choosing key set to the text the user wrote."""
    if getattr(obj, key, None) == name:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # a copy through the plain dataclass constructor, which validates
        # nothing (pydantic would hold the import path against a
        # Literal["short"] annotation); the plug-in object stays frozen
        return dataclasses.replace(obj, **{key: name})
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
        try:
            adapter: TypeAdapter[object] = TypeAdapter(cls)
        except PydanticSchemaGenerationError as exc:  # a field of no known type
            what = str(exc).split(". ")[0]  # "Unable to ... schema for <class X>"
            raise ValueError(
                f"plug-in {name!r} has a field of a type a scenario file cannot "
                f"hold ({what}); expected numbers, text, booleans, None, or "
                "lists and mappings of them"
            ) from None
        obj: object = adapter.validate_python(rest, context=info.context)
        _check_writable(obj, name)
        return _named(obj, spec.key, name)

    return validate


def _check_writable(obj: object, name: str) -> None:
    """Refuse a plug-in whose fields cannot be written to scenario.yaml (a
    ``threading.Lock``, an open file): every run folder keeps the resolved
    scenario, and ``validate`` prints it, so such a field would fail there,
    as a serializer's traceback, instead of here in one line.

    Raises:
        ValueError: naming the field, its value's type and what is expected
            (pydantic reports it at the section, with the scenario's file).
    """
    if dataclasses.is_dataclass(obj):
        values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    elif isinstance(obj, BaseModel):
        values = {f: getattr(obj, f) for f in type(obj).model_fields}
    else:
        return
    for field, value in values.items():
        try:
            to_jsonable_python(value)
        except Exception:  # noqa: BLE001 - pydantic's error is the traceback we avoid
            raise ValueError(
                f"field {field!r} of plug-in {name!r} holds a "
                f"{type(value).__module__}.{type(value).__qualname__}, which "
                "cannot be written to scenario.yaml (expected numbers, text, "
                "booleans, None, or lists and mappings of them; keep other "
                "objects out of the fields, e.g. made in a method)"
            ) from None


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
