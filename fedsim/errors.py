"""The base of fedsim's own errors, and the two times they are found.

Every error fedsim raises on purpose derives from :class:`FedsimError`,
through one of two bases that say *when* it was found:

- :class:`LoadError`: the input is wrong (a scenario field, a plug-in that
  cannot be loaded, a data root, a checkpoint of another experiment), found
  before any training: exit 2.
- :class:`RunError`: the run could not go on (a diverged model, a lost Ray
  worker or server actor, a stalled timeline, a plug-in whose own code
  raised during the run): exit 1, or 3 for a plug-in's failure.

Each also keeps the built-in base it had (``ValueError``, ``OSError``,
``RuntimeError``, ...), so ``except ValueError`` around a loader still
works. The commands report any of them as one line with its
:attr:`FedsimError.exit_code` (fedsim/tools/cli.py), with one exception:
``fedsim run`` reports runtime's ``SetupError`` (the run's folder or
settings refused before any training) with exit 2, as the refused input it
is to the user. An exception that is not a FedsimError is a bug and keeps
its traceback.

Example:
    >>> from fedsim.scenario import ScenarioError
    >>> issubclass(ScenarioError, LoadError), ScenarioError.exit_code
    (True, 2)
"""

from __future__ import annotations

from typing import ClassVar


class FedsimError(Exception):
    """An error fedsim raises on purpose; its text is written for the user.

    Attributes:
        exit_code: the command's exit status when this error ends it.
    """

    exit_code: ClassVar[int] = 1


class LoadError(FedsimError):
    """Found before training: the input (file, field, plug-in, data) is
    wrong, and the message names it. Exit 2."""

    exit_code: ClassVar[int] = 2


class RunError(FedsimError):
    """Found during the run: it could not go on. Exit 1 unless a subclass
    says otherwise (a plug-in's own failure: 3)."""

    exit_code: ClassVar[int] = 1
