"""The cluster tests' runs that differ only in their settings, all in turn in
one job's driver on the head (the ``cluster_batch`` fixture of
tests/conftest.py, through :meth:`Cluster.fedsim_in_one_job`).

Every job pays its submission, its upload, its job supervisor and a driver's
Python, torch and Ray start-up: seconds of CPU each on two busy cores, on the
suite's critical path (the cluster tests run in one process). Three tests
each had a job of their own for runs like these; now they share one, and
each reads its own runs' exit codes, run folders and the job's logs:

- placement (tests/test_multinode.py): ``spread``, ``pack``,
  ``strict_pack``, ``strict_spread`` (refused, exit 2);
- per-node data (tests/test_multinode.py, with the shared MNIST test set):
  ``missing`` (refused, exit 2), ``root``;
- the server actor (tests/test_server_actor.py): ``driver``, ``actor``, and
  ``pns`` (with the shared MNIST test set);
- real data through the object store (tests/test_multinode.py, with the
  shared MNIST test set): ``mnist``.

A run that fails does not stop the next one (each prints its own ``exit
CODE`` line), so one test's failure stays its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .conftest import HAS_MNIST, MNIST

# scenarios/papers/fedpns-mnist-like.yaml on the MNIST test set only (the
# scenario's own comment), FedAvg, 3 rounds.
MNIST_ARGS = [
    "scenarios/papers/fedpns-mnist-like.yaml",
    *("--set", "data.files=test", "--set", "data.test_fraction=0.3"),
    *("--set", "data.partition.samples_per_client=140", "--set", "rounds=3"),
    *("--set", "algorithm={name: fedavg}"),
    *("--set", "selector={name: uniform, clients_per_round: 10}"),
    *("--workers", "2", "--no-report"),  # no plots: seconds on busy cores
]
QUICK = ["scenarios/quickstart.yaml", "--set", "rounds=2", "--no-report"]
# tiny-synthetic is generated from the seed: no data files on any node
TINY_ARGS = ["scenarios/ci/tiny-synthetic.yaml", "--set", "rounds=3"]
TINY_ARGS += ["--workers", "2", "--no-report"]
# FedPNS scores model choices on the server (server-side compute), on the
# MNIST test set the head alone has; it reaches the actor via the object store.
PNS_ARGS = [
    "scenarios/papers/fedpns-mnist-like.yaml",
    *("--set", "data.files=test", "--set", "data.test_fraction=0.3"),
    *("--set", "data.partition.samples_per_client=140", "--set", "rounds=2"),
    *("--workers", "2", "--no-report"),
]
ON_NODE_B = "resources.server={home: actor, cpus: 0, resources: {node_b: 0.01}}"
ON_GPU = "resources.server={home: actor, cpus: 0, gpus: 1, resources: {node_a: 0.01}}"

PLACEMENT = ("spread", "pack", "strict_pack", "strict_spread")
PER_NODE_DATA = ("missing", "root")
SERVER = ("driver", "actor", "pns")


def batch_runs(out: Path) -> dict[str, list[str]]:
    """Each run's ``fedsim run`` arguments, by name, writing to ``out/NAME``;
    the MNIST runs only where the shared MNIST test set is (their tests skip
    elsewhere)."""
    two = ["--workers", "2"]
    per_node = ["--set", "resources.data=per_node"]
    # In turn in one warm pool (cluster_utils._fedsim_in_turn): the runs on
    # two workers under ``spread`` go first, each taking over the worker
    # actors of the one before (a placement group or per-node data never
    # parks its actors, and a run of another shape kills the parked ones).
    runs = {
        # spread (the default): new worker actors, placed as Ray spreads them
        "spread": [*QUICK, *two],
        # the server in the driver, then an actor pinned to node b
        "driver": [*TINY_ARGS],
        "actor": [*TINY_ARGS, "--set", ON_NODE_B],
    }
    if HAS_MNIST:
        # the data reaches the worker nodes through the object store only
        runs["mnist"] = [*MNIST_ARGS]
        # FedPNS, the server an actor with a GPU on node a
        runs["pns"] = [*PNS_ARGS, "--set", ON_GPU]
    runs |= {
        # pack, with half a (fake) GPU each
        "pack": [
            *(*QUICK, *two, "--set", "resources.placement=pack"),
            *("--set", "resources.gpus_per_worker=0.5"),
        ],
        "strict_pack": [*QUICK, *two, "--set", "resources.placement=strict_pack"],
        # 4 workers on 3 worker nodes (the head has no CPU): refused
        "strict_spread": [
            *(*QUICK, "--workers", "4", "--set", "resources.placement=strict_spread"),
            *("--set", "resources.placement_timeout_s=5"),
        ],
    }
    if HAS_MNIST:
        # The worker nodes' data root is empty: refused, naming them.
        runs["missing"] = [*MNIST_ARGS, *per_node]
        # With data.root naming files every node has (one machine): it runs,
        # each worker reading its own copy.
        runs["root"] = [*MNIST_ARGS, *per_node, "--set", f"data.root={MNIST}"]
    return {name: [*args, "--out", str(out / name)] for name, args in runs.items()}


@dataclass(frozen=True)
class Batch:
    """What the batch's job left: the runs' folder (``out/NAME``), the job's
    logs and each run's exit code, by name."""

    out: Path
    logs: str
    codes: dict[str, int]

    def codes_of(self, names: tuple[str, ...]) -> dict[str, int]:
        """The exit codes of ``names`` that ran (the MNIST runs may not)."""
        return {n: self.codes[n] for n in names if n in self.codes}
