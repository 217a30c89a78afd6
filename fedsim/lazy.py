"""The heavy modules (torch, pyarrow, simpy), imported when first used.

``fedsim validate`` and ``--help`` load every plug-in class but run none of its
code, and importing torch takes seconds. ``from fedsim.lazy import torch`` gives
mypy the real module and, at run time, a stand-in (not in ``sys.modules``) that
imports torch when one of its attributes is first read.

Example:
    >>> json_mod = lazy_import("json")
    >>> json_mod.dumps([1])
    '[1]'
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any


class LazyModule(types.ModuleType):
    """Attributes read are kept here (training loops read ``torch.*`` often), so
    rebinding one on the real module afterwards is not seen here."""

    def __getattr__(self, attr: str) -> Any:
        # only called for names not yet kept here (and not ModuleType's own)
        value = getattr(importlib.import_module(self.__name__), attr)
        self.__dict__[attr] = value
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def lazy_import(name: str) -> types.ModuleType:
    """A stand-in for ``import name`` (e.g. ``"torch.nn"``), imported on first use."""
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
