"""The heavy modules, imported the first time they are used.

``fedsim validate`` and ``fedsim --help`` load every algorithm, selector and
dataset class (they are the scenario's registry) but run none of their code,
and importing torch costs seconds (pyarrow and simpy a tenth each). A module
that needs one of them only inside its functions imports it from here::

    from fedsim.lazy import torch

mypy reads the real module; at run time ``torch`` is a stand-in that imports
torch when one of its attributes is first read. The stand-in is not put in
``sys.modules``, so ``"torch" in sys.modules`` stays false until torch is
really imported. ``lazy_import`` makes a stand-in for any other module.

Example:
    >>> json_mod = lazy_import("json")
    >>> json_mod.dumps([1])
    '[1]'
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

__all__ = [
    "F",
    "LazyModule",
    "lazy_import",
    "nn",
    "pa",
    "pc",
    "simpy",
    "torch",
]


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


if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import simpy as simpy
    import torch as torch
    import torch.nn.functional as F
    from torch import nn as nn
else:
    torch = lazy_import("torch")
    nn = lazy_import("torch.nn")
    F = lazy_import("torch.nn.functional")
    pa = lazy_import("pyarrow")
    pc = lazy_import("pyarrow.compute")
    simpy = lazy_import("simpy")
