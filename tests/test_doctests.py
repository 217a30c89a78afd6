"""Every example in fedsim's docstrings runs and prints what it says: the
interfaces people extend (algorithms, selectors, executors) carry runnable
examples, and this keeps them true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fedsim

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(fedsim.__path__, prefix="fedsim.")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} failed"
