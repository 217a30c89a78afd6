"""The selection of an algorithm that chooses its own clients.

An algorithm that declares :attr:`~fedsim.algorithms.base.Algorithm.chooses`
(Flower's strategies, which sample their own nodes) picks the round's
clients in :meth:`~fedsim.algorithms.base.Algorithm.choose_clients`. The
runtime then puts :class:`AlgorithmChoice` where the scenario's selector
stood: the selector still keeps its state, its observations and its columns,
and (``chooses == "picks"``) makes the picks the algorithm chooses among.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from fedsim import hooks
from fedsim.algorithms.base import ClientChoice
from fedsim.selectors.base import Selector

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.base import Algorithm, ServerState
    from fedsim.facts import RunFacts
    from fedsim.selectors.base import (
        Draw,
        Ints,
        RoundResult,
        SelectorContext,
        SelectorState,
    )


class ServerView(Protocol):
    """What :class:`AlgorithmChoice` reads of the driver's server."""

    @property
    def state(self) -> ServerState:
        """The server state the round starts from."""

    @property
    def model(self) -> torch.nn.Module:
        """The global model (its named parameters lay out ``x``)."""


@dataclass(frozen=True, kw_only=True)
class AlgorithmChoice(Selector):
    """The scenario's selector (``inner``) with the algorithm's choice on
    top: :meth:`select` hands the round's candidates, or the selector's
    picks, to ``algorithm.choose_clients``; every other hook is the
    selector's own.

    Args:
        inner: the scenario's selector.
        algorithm: the algorithm that chooses (``chooses`` set).
        server: the driver's server (its state and model, read only).
        facts: the run as plug-ins see it.
    """

    inner: Selector
    algorithm: Algorithm
    server: ServerView
    facts: RunFacts

    @classmethod
    def around(
        cls, inner: Selector, algorithm: Algorithm, server: ServerView, facts: RunFacts
    ) -> AlgorithmChoice:
        """``inner`` wrapped, under its own name and count."""
        return cls(
            name=inner.name,
            clients_per_round=inner.clients_per_round,
            inner=inner,
            algorithm=algorithm,
            server=server,
            facts=facts,
        )

    @property
    def adaptive(self) -> bool:
        """The selector's (:attr:`Selector.adaptive`)."""
        return self.inner.adaptive

    def with_slots(self, k: int) -> AlgorithmChoice:
        """The selector resized (:meth:`Selector.with_slots`), still wrapped."""
        return replace(self, inner=self.inner.with_slots(k), clients_per_round=k)

    def init(self, ctx: SelectorContext) -> SelectorState:
        """The selector's initial state."""
        return self.inner.init(ctx)

    def select(self, state: SelectorState, draw: Draw) -> tuple[Ints, SelectorState]:
        """The selector's picks (``chooses == "picks"``) or every candidate,
        then the algorithm's choice among them.

        Raises:
            PluginFailure: ``choose_clients`` raised, named as the
                algorithm's hook, not as the selector it wraps.
        """
        nodes = draw.candidates
        if self.algorithm.chooses == "picks":
            nodes, state = self.inner.select(state, draw)
        ids = tuple(int(i) for i in nodes)
        choice = ClientChoice(draw.round, ids, draw.rng, self.facts, self.server.model)
        alg = self.algorithm
        chosen = hooks.call(
            hooks.algorithm_label(alg.name),
            "choose_clients",
            alg.choose_clients,
            self.server.state,
            choice,
        )
        return np.asarray(chosen, dtype=np.int64), state

    def observe(
        self,
        state: SelectorState,
        round_: int,
        result: RoundResult,
        ctx: SelectorContext,
    ) -> SelectorState:
        """The selector's (:meth:`Selector.observe`)."""
        return self.inner.observe(state, round_, result, ctx)

    def multiplicity(self, state: SelectorState, ids: Ints) -> dict[int, int] | None:
        """The selector's (:meth:`Selector.multiplicity`)."""
        return self.inner.multiplicity(state, ids)

    def artifact(self, state: SelectorState, round_: int) -> list[dict[str, object]]:
        """The selector's (:meth:`Selector.artifact`)."""
        return self.inner.artifact(state, round_)

    def metrics(self, state: SelectorState, round_: int) -> dict[str, float]:
        """The selector's (:meth:`Selector.metrics`)."""
        return self.inner.metrics(state, round_)
