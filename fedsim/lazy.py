"""Import a module, or a function of one, the first time it is used.

``fedsim validate`` and ``fedsim --help`` load every algorithm, selector and
dataset class (they are the scenario's registry) but run none of their code,
and importing torch costs seconds. A module that needs torch only inside its
functions imports it so::

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy_import("torch")

mypy reads the real module; at run time ``torch`` is a stand-in that imports
torch when one of its attributes is first read. The stand-in is not put in
``sys.modules``, so ``"torch" in sys.modules`` stays false until torch is
really imported.

Example:
    >>> json_mod = lazy_import("json")
    >>> json_mod.dumps([1])
    '[1]'
    >>> lazy_function("json", "dumps")([2])
    '[2]'
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from typing import Any

__all__ = ["LazyModule", "lazy_import", "lazy_function"]


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name``: reading an attribute imports it.

    Each attribute read is kept here, so from the second read on it costs a
    plain module look-up (training loops read ``torch.*`` often). The flip
    side: rebinding an attribute of the real module (``torch.foo = ...``)
    after the stand-in has read it is not seen here.
    """

    def __getattr__(self, attr: str) -> Any:
        # only called for names not yet kept here (and not ModuleType's own)
        value = getattr(importlib.import_module(self.__name__), attr)
        self.__dict__[attr] = value
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def lazy_import(name: str) -> types.ModuleType:
    """A stand-in for ``import name`` that imports the module on first use.

    Args:
        name: the module's full name, e.g. ``"torch"`` or ``"torch.nn"``.
    """
    return LazyModule(name)


def lazy_function(module: str, name: str) -> Callable[..., Any]:
    """A stand-in for ``from module import name`` (a function) that imports
    ``module`` when the function is first called.

    Args:
        module: the module's full name.
        name: the function's name in it.
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Calls {module}.{name} (imported on the first call)."
    return call
