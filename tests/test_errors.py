"""fedsim's own errors: one base, and a kind that says when each is found.

Every exception class the package defines derives from
:class:`fedsim.errors.LoadError` (bad input, exit 2) or
:class:`fedsim.errors.RunError` (the run could not go on, exit 1; a
plug-in's own failure 3), and the ``fedsim`` command reports one that
ends a command as one line with that code, in one place (its command
group).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys

import pytest

import fedsim
from fedsim.errors import FedsimError, LoadError, RunError


def _defined_exceptions() -> dict[str, type[BaseException]]:
    out = {}
    for info in pkgutil.walk_packages(fedsim.__path__, "fedsim."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Exception)
                and not issubclass(obj, Warning)
                and obj.__module__ == info.name
                and info.name != "fedsim.errors"  # the bases themselves
            ):
                out[f"{info.name}.{name}"] = obj
    return out


def test_every_error_of_the_package_says_when_it_was_found():
    # Prepare / Execute
    found = _defined_exceptions()
    # Assert: every one is a load-time or a run-time FedsimError
    assert len(found) >= 20  # the walk reached the package
    stray = [n for n, c in found.items() if not issubclass(c, (LoadError, RunError))]
    assert stray == []


def test_the_kinds_carry_their_exit_codes():
    from fedsim.hooks import PluginFailure
    from fedsim.scenario import ScenarioError
    from fedsim.server import DivergenceError

    assert ScenarioError.exit_code == 2
    assert DivergenceError.exit_code == 1
    assert PluginFailure.exit_code == 3
    # the built-in base stays: a loader's ``except ValueError`` still works
    assert issubclass(ScenarioError, ValueError)


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda: __import__("fedsim.scenario").scenario.ScenarioError("x: bad"), 2),
        (lambda: __import__("fedsim.server").server.DivergenceError("nan"), 1),
        (lambda: __import__("fedsim.hooks").hooks.PluginFailure("p", "h", "e"), 3),
    ],
)
def test_an_error_no_command_caught_is_one_line_with_its_code(
    monkeypatch, capsys, make, code
):
    # Prepare: a command (validate) whose first step lets a fedsim error
    # escape; the command group is the one place that reports it
    from fedsim.tools import cli

    exc = make()
    assert isinstance(exc, FedsimError)

    def escaping(*args: object) -> None:
        raise exc

    monkeypatch.setattr(cli, "_load", escaping)
    monkeypatch.setattr(sys, "argv", ["fedsim", "validate", "any.yaml"])
    # Execute
    with pytest.raises(SystemExit) as ended:
        cli.main()
    # Assert: its code, one line naming the error, no traceback
    assert ended.value.code == code
    err = capsys.readouterr().err
    assert err.startswith("error:") and str(exc) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
