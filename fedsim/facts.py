"""What a plug-in may read of the run it takes part in: :class:`RunFacts`.

A plug-in's questions about a run (``Algorithm.check``, ``clock_work``,
``memory``, ``bytes_per_client``; ``Selector.check``) receive this small,
frozen, typed record instead of the whole scenario: the sections a check
needs (local training, the round policy, the fleet, the data and model
sections) and the run's numbers, but not the other plug-ins, the resources
or where results go. The scenario builds it once it is validated
(``Scenario.facts``), and the runtime builds the same record for the
questions it asks during set-up, so a plug-in sees one type everywhere.

Its own module, above the clock, fleet and spec modules whose sections it
names and below the plug-ins that read it (tests/test_imports.py).

Example:
    >>> from fedsim.scenario import load_scenario
    >>> facts = load_scenario("scenarios/quickstart.yaml").facts
    >>> facts.num_clients, facts.round.policy, facts.elem_bytes
    (30, 'fixed_window', 4)
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.clock import RoundSpec
from fedsim.data.base import DatasetSpec
from fedsim.fleet import FleetSpec
from fedsim.spec import ClientSpec, Model


@dataclass(frozen=True)
class RunFacts:
    """The run as a plug-in's questions see it.

    Attributes:
        seed: the run's seed (every random choice derives from it).
        rounds: rounds to run (asynchronous mode: server versions).
        num_clients: m, the fleet's size (device i is client i).
        clients_per_round: the selector's ``clients_per_round``.
        client: local training (solver, lr, batch size).
        round: how tau_i arises (policy, window, epochs, ...).
        fleet: the devices (groups with speed, network, availability).
        data: the ``data`` section, a dataset spec (``info`` states its
            samples without building them).
        dataset: the ``data.dataset`` name the scenario wrote, for messages.
        model: the ``model`` section.
        server_home: ``resources.server.home``: where the server runs
            (``driver`` or ``actor``).
        checkpoint_every: ``checkpoint.every_rounds`` (0: no checkpoints).
        federated_every: ``eval.federated_every`` (0: no federated
            evaluation, so ``aggregate_evaluation`` is never called).
    """

    seed: int
    rounds: int
    num_clients: int
    clients_per_round: int
    client: ClientSpec
    round: RoundSpec
    fleet: FleetSpec
    data: DatasetSpec
    dataset: str
    model: Model
    server_home: str = "driver"
    checkpoint_every: int = 0
    federated_every: int = 0

    @property
    def elem_bytes(self) -> int:
        """Bytes per model parameter (what a model vector costs to send or
        store), from ``model.dtype``."""
        return self.model.elem_bytes
