"""fedsim's extension API: what a plug-in subclasses and what it receives.

Everything a new algorithm, selector, model or dataset needs is importable from
here; the names are stable, the modules they live in are not. A plug-in is an
ordinary class in the user's own package, used by a scenario through its
import path, or through a short name its package registers as an entry point
(docs/extending.md has the worked example in ``examples/fedsim_example``):

.. code-block:: yaml

    algorithm: {name: fedsim_example.fedexp:FedExP, epsilon: 0.001}
    selector: {name: fastest_k, clients_per_round: 5}   # an entry point

========================  ====================================================
Kind (scenario section)   Base class, entry-point group, what to implement
========================  ====================================================
``algorithm``             :class:`Algorithm`, ``fedsim.algorithms``:
                          ``aggregate`` (and client hooks, :meth:`check`, ...)
``selector``              :class:`Selector`, ``fedsim.selectors``: ``init``,
                          ``select``, optionally ``observe``
``model``                 :class:`Model`, ``fedsim.models``: ``build``,
                          ``param_count``
``data``                  :class:`Dataset`, ``fedsim.datasets``: ``build``,
                          ``info``
========================  ====================================================

Algorithms and selectors are frozen dataclasses whose fields are their
hyperparameters; models and datasets are pydantic models (:class:`Spec`).
Either way the fields *are* the scenario section: unknown keys are refused,
``Annotated[float, Field(gt=0)]`` constraints are checked when the file is
loaded, and ``fedsim validate`` prints the resolved section.

What a plug-in receives is small and typed: the server step's
:class:`RoundContext` (the round, asynchronous staleness and start models,
the round's lost clients as :class:`Failure` records, and the
:class:`ServerContext` of an algorithm that declares ``server_needs``), a
client's :class:`ClientContext` (its :class:`ClientInfo`, the payload, its
persistent state), federated evaluation's :class:`ClientEvaluation`
records (``aggregate_evaluation``), the :class:`LocalTraining` job of an
algorithm that replaces the solver loop, a selector's
:class:`SelectorContext` and :class:`Draw`, and, for its questions about the
run (``check``, ``clock_work``, ``memory``, ``bytes_per_client``), the run's
:class:`RunFacts`.

Its contract is checked by :func:`fedsim.testing.check_algorithm` and
:func:`fedsim.testing.check_selector`, which fedsim's own tests run on every
built-in.

The hooks a method may add (docs/extending.md, "Hooks"), each optional:

========================================  ====================================
Hook                                      What it gives
========================================  ====================================
:meth:`Algorithm.choose_clients`          the algorithm's own choice of the
(with :attr:`Algorithm.chooses`)          round's clients, on top of the
                                          selector (:class:`ClientChoice`)
:meth:`Algorithm.instruct`                per-client payload entries (a
                                          learning rate, a mask), synchronous
                                          rounds
``AggregateInfo.metrics``                 named scalars per step: columns
(:func:`meter`'s ``metrics``)             ``alg_<name>`` of rounds.parquet
:meth:`Selector.metrics`                  the same for a selector
                                          (``sel_<name>``)
``RoundContext.failures``                 the step's dropped and late
                                          clients, with the reason
:meth:`Algorithm.aggregate_evaluation`    federated evaluation's rule: the
                                          clients' :class:`ClientEvaluation`
                                          records (loss, accuracy on their
                                          own held-out rows) to columns
                                          ``fed_<name>`` (default:
                                          :func:`weighted_evaluation`)
:meth:`Algorithm.server_flops`,           the server's own work, billed on
``AggregateInfo.server_work``             the clock at the ``server`` speed
                                          (:class:`ServerWork`)
========================================  ====================================

During a run, an exception in plug-in code, or a hook that returns what its
contract does not allow, is a :class:`PluginFailure` naming the plug-in and
the hook: the run ends with ``status: failed`` (exit 3), its rows kept and
the traceback in the run folder's ``failure.txt``.

Example (an algorithm that averages the updates and halves the step):
    >>> from dataclasses import dataclass
    >>> from fedsim.api import (Algorithm, ClientUpdate, PLAIN_ROUND, meter,
    ...                         skip_empty_rounds)
    >>> @dataclass(frozen=True)
    ... class Half(Algorithm):
    ...     @skip_empty_rounds
    ...     def aggregate(self, state, updates, ctx=PLAIN_ROUND):
    ...         w = [1 / len(updates)] * len(updates)
    ...         step = sum(wi * u.delta for wi, u in zip(w, updates))
    ...         return {"x": state["x"] + 0.5 * step}, meter(updates, w, 1.0)
    >>> from fedsim.lazy import torch
    >>> ups = [ClientUpdate(0, torch.tensor([2.0]), 1, 1, 1.0, 0.0),
    ...        ClientUpdate(1, torch.tensor([4.0]), 1, 1, 1.0, 0.0)]
    >>> Half().aggregate({"x": torch.zeros(1)}, ups)[0]["x"]
    tensor([1.5000])

    In its module (so that it pickles), the contract would check it with
    ``fedsim.testing.check_algorithm(Half(), identical=lambda a, x0, d, n:
    x0 + 0.5 * d)``.
"""

from __future__ import annotations

from fedsim.algorithms.base import (
    PLAIN_ROUND,
    AggregateInfo,
    Algorithm,
    AsyncRule,
    ClientChoice,
    ClientContext,
    ClientEvaluation,
    ClientInfo,
    ClientState,
    ClientUpdate,
    Failure,
    LocalTraining,
    RoundContext,
    ServerContext,
    ServerState,
    ServerWork,
    Updates,
    data_weights,
    meter,
    meter_average,
    meter_subset,
    skip_empty_rounds,
    weighted_evaluation,
)
from fedsim.clock import JobWork
from fedsim.compression import Compressor
from fedsim.data.base import DataInfo, Dataset, FederatedData
from fedsim.facts import RunFacts
from fedsim.hooks import PluginFailure
from fedsim.plugins import PluginError, resolve
from fedsim.selectors.base import Draw, Selector, SelectorContext, SelectorState
from fedsim.spec import (
    PLUGIN_CONFIG,
    ClientSpec,
    Model,
    NonNegFloat,
    PosFloat,
    PosInt,
    Prob,
    Problem,
    ScenarioWarning,
    Spec,
)

__all__ = [
    "PLAIN_ROUND",
    "PLUGIN_CONFIG",
    "AggregateInfo",
    "Algorithm",
    "AsyncRule",
    "ClientChoice",
    "ClientContext",
    "ClientEvaluation",
    "ClientInfo",
    "ClientSpec",
    "ClientState",
    "ClientUpdate",
    "Compressor",
    "DataInfo",
    "Dataset",
    "Draw",
    "Failure",
    "FederatedData",
    "JobWork",
    "LocalTraining",
    "Model",
    "NonNegFloat",
    "PluginError",
    "PluginFailure",
    "PosFloat",
    "PosInt",
    "Prob",
    "Problem",
    "RoundContext",
    "RunFacts",
    "ScenarioWarning",
    "Selector",
    "SelectorContext",
    "SelectorState",
    "ServerContext",
    "ServerState",
    "ServerWork",
    "Spec",
    "Updates",
    "data_weights",
    "meter",
    "meter_average",
    "meter_subset",
    "resolve",
    "skip_empty_rounds",
    "weighted_evaluation",
]

# Names of earlier versions, each with what replaced it: importing one stops
# with that line (an ImportError, which ``from fedsim.api import`` passes on
# as it is) instead of Python's bare "cannot import name".
_REMOVED = {"ScenarioView": "RunFacts (the run as plug-ins see it)"}


def __getattr__(name: str) -> object:
    """Refuse a removed name, naming its replacement.

    Args:
        name: the attribute asked for.

    Raises:
        ImportError: ``name`` was removed (the message names the new form).
        AttributeError: no such name.
    """
    if name in _REMOVED:
        raise ImportError(f"fedsim.api.{name} was removed: use {_REMOVED[name]}")
    raise AttributeError(f"module 'fedsim.api' has no attribute {name!r}")
