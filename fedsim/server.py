"""The server and the round loop.

:class:`ServerCore` holds the algorithm's server state and per-client state,
aggregates each round's updates and evaluates the global model. With Ray it
runs as an actor, and updates travel from the worker actors straight to it.

:class:`Simulation` is the round loop. It reads like the papers' pseudo-code;
simulated time is decided by :mod:`fedsim.clock` and nothing else::

    for t in rounds:
        available = fleet.online(T)
        S_t       = selector.select(available, k, rng_t)
        plan      = clock.plan_round(S_t, T, policy)      # tau_i, arrivals, drops
        updates   = pool.train(x_t, plan)                  # real SGD on workers
        x_{t+1}   = algorithm.aggregate(state, updates)    # on the server
        record(round t); T = plan.t_end
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim import clock
from fedsim.algorithms import AggregateInfo, ClientUpdate, make_algorithm
from fedsim.algorithms.base import ServerContext
from fedsim.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    commit_checkpoint,
    latest_checkpoint,
    load_arrays,
    load_tensors,
    save_arrays,
    save_tensors,
    write_meta,
)
from fedsim.data import FederatedData, build_data
from fedsim.data.base import as_tensor as _tensor
from fedsim.fleet import Fleet
from fedsim.models import evaluate, make_model
from fedsim.params import flatten, l2_norm
from fedsim.results import Recorder
from fedsim.scenario import Scenario
from fedsim.selectors import SelectorContext, make_selector
from fedsim.store import ClientStore
from fedsim.workers import LocalPool, RayPool, Task

__all__ = ["ServerCore", "Simulation", "DivergenceError", "RoundResult"]

_SELECT_TAG = 0x5E1
_CLOCK_TAG = 0xC10C


class DivergenceError(RuntimeError):
    """The global model or the training loss became NaN or infinite."""


def weighted_train_loss(updates: Sequence[ClientUpdate]) -> float:
    """The round's training loss: the updates' losses weighted as their data
    (NaN when no update arrived)."""
    if not updates:
        return float("nan")
    total = sum(u.weight for u in updates)
    return sum(u.weight * u.train_loss for u in updates) / total


def evaluates(scenario: Scenario, t: int) -> bool:
    """Whether round (or version) ``t`` ends with an evaluation."""
    return (t + 1) % scenario.eval.every_rounds == 0 or t == scenario.rounds - 1


@dataclass(frozen=True)
class ClientStats:
    update_norm: float
    train_loss: float
    weight: float  # effective aggregation weight w_i
    bytes_up: int | None = None  # real upload size, when the algorithm says
    flags: dict[str, Any] = field(default_factory=dict)  # extra client columns


@dataclass(frozen=True)
class RoundResult:
    info: AggregateInfo
    clients: dict[int, ClientStats]
    train_loss: float
    test_loss: float
    test_accuracy: float


class ServerCore:
    """Server state, per-client state, aggregation and evaluation."""

    def __init__(
        self,
        scenario: Scenario,
        data: FederatedData | list[Any],
        threads: int | None = 1,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        self._data_ref = None
        if isinstance(data, list):  # [ObjectRef]: keep the reference for workers
            import ray

            self._data_ref = data
            data = ray.get(data[0])
        self.scenario = scenario
        self.algorithm = make_algorithm(scenario.algorithm)
        self.model = make_model(scenario, data)
        x0 = flatten(self.model)
        self.state = self.algorithm.init(x0, data.num_clients)
        self.store = ClientStore(data.num_clients, x0.numel(), x0.dtype)
        dtype = x0.dtype
        self.test_x = _tensor(data.test_x).to(dtype)
        ty = _tensor(data.test_y)
        self.test_y = ty if data.num_classes else ty.to(dtype)
        self.test_weights = data.test_weights
        # The validation set (FedPNS's CHECK LOSS): the dataset's own, or the
        # test set when the dataset has none.
        val = getattr(data, "val_x", None)
        if val is not None:
            self.val_x = _tensor(val).to(dtype)
            vy = _tensor(data.val_y)
            self.val_y = vy if data.num_classes else vy.to(dtype)
            self.val_weights = None
        else:
            self.val_x, self.val_y = self.test_x, self.test_y
            self.val_weights = self.test_weights
        self.num_classes = data.num_classes
        self._data = data
        self._context: ServerContext | None = None

    @property
    def num_params(self) -> int:
        return int(self.state["x"].numel())

    def params(self) -> torch.Tensor:
        return self.state["x"]

    def data_ref(self) -> list[Any]:
        """[ObjectRef] of the shared dataset (for worker actors to fetch)."""
        return self._data_ref or []

    def payload(self) -> dict[str, torch.Tensor]:
        """What every selected client downloads this round."""
        return self.algorithm.payload(self.state)

    def client_states(self, clients: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The persistent states of these clients ({} for stateless algorithms)."""
        if not self.algorithm.stateful:
            return {}
        return self.store.get(clients)

    def aggregate(
        self,
        *batches: Sequence[ClientUpdate],
        multiplicity: dict[int, int] | None = None,
    ) -> RoundResult:
        """Aggregate the round's updates (any number of lists, in any order).

        ``multiplicity``: how many times the selector drew each client (a
        selector sampling with replacement); it reaches the algorithm as each
        update's ``multiplicity`` extra (FedAvg's ``sampling: proportional``).
        """
        updates = sorted((u for b in batches for u in b), key=lambda u: u.client)
        if multiplicity:
            updates = [
                replace(
                    u,
                    extras={
                        **u.extras,
                        "multiplicity": torch.tensor(
                            float(multiplicity.get(u.client, 1)), dtype=torch.float64
                        ),
                    },
                )
                for u in updates
            ]
        if self.algorithm.needs_server:
            self.state, info = self.algorithm.aggregate(
                self.state, updates, server=self.context()
            )
        else:
            self.state, info = self.algorithm.aggregate(self.state, updates)
        for u in updates:
            if u.new_state is not None:
                self.store.put(u.client, u.new_state)
        if not bool(torch.isfinite(self.state["x"]).all()):
            raise DivergenceError("the global model has NaN or infinite parameters")
        stats = {
            u.client: ClientStats(
                update_norm=l2_norm(u.delta),
                train_loss=u.train_loss,
                weight=info.weights.get(u.client, 0.0),
                bytes_up=u.bytes_up,
                flags=info.flags.get(u.client, {}),
            )
            for u in updates
        }
        train_loss = weighted_train_loss(updates)
        return RoundResult(info, stats, train_loss, float("nan"), float("nan"))

    def context(self) -> ServerContext:
        """The server's model and validation loss, for algorithms that need them."""
        if self._context is None:
            val_x, val_y, val_w = self.val_x, self.val_y, self.val_weights
            eval_model = make_model(self.scenario, self._data)

            def loss(x: torch.Tensor) -> float:
                torch.nn.utils.vector_to_parameters(x, eval_model.parameters())
                return evaluate(
                    eval_model, val_x, val_y, self.scenario.eval.batch_size, val_w
                )[0]

            train_model = make_model(self.scenario, self._data)
            self._context = ServerContext(train_model, loss, self.num_classes)
        return self._context

    def evaluate(self) -> tuple[float, float]:
        torch.nn.utils.vector_to_parameters(self.state["x"], self.model.parameters())
        return evaluate(
            self.model,
            self.test_x,
            self.test_y,
            batch_size=self.scenario.eval.batch_size,
            weights=self.test_weights,
        )

    def save(self, ckpt_dir: str) -> None:
        """Write the server state and per-client state into ``ckpt_dir``."""
        path = Path(ckpt_dir)
        path.mkdir(parents=True, exist_ok=True)
        save_tensors(path / "server.pt", self.state)
        save_arrays(path, self.store.export())

    def load(self, ckpt_dir: str) -> None:
        path = Path(ckpt_dir)
        state = load_tensors(path / "server.pt")
        if set(state) != set(self.state) or state["x"].shape != self.state["x"].shape:
            raise CheckpointError(
                f"{path}: server state does not match this scenario's model"
            )
        self.state = state
        self.store.restore(load_arrays(path))

    def round(
        self,
        *batches: Sequence[ClientUpdate],
        do_eval: bool,
        multiplicity: dict[int, int] | None = None,
    ) -> RoundResult:
        res = self.aggregate(*batches, multiplicity=multiplicity)
        if do_eval:
            loss, acc = self.evaluate()
            res = RoundResult(res.info, res.clients, res.train_loss, loss, acc)
        return res


class _LocalBackend:
    """Everything in this process: the path unit tests take."""

    def __init__(self, scenario: Scenario, data: FederatedData) -> None:
        threads = max(1, int(scenario.resources.cpus_per_worker))
        self.server = ServerCore(scenario, data, threads=threads)
        self.pool = LocalPool(scenario, data)
        self.workers = 0

    def run_round(
        self,
        tasks: list[Task],
        do_eval: bool,
        multiplicity: dict[int, int] | None = None,
    ) -> RoundResult:
        states = self.server.client_states([t.client for t in tasks])
        updates = self.pool.train(self.server.payload(), tasks, states)
        return self.server.round(updates, do_eval=do_eval, multiplicity=multiplicity)

    def num_params(self) -> int:
        return self.server.num_params

    def params(self) -> torch.Tensor:
        return self.server.params().clone()

    def save(self, ckpt_dir: Path) -> None:
        self.server.save(str(ckpt_dir))

    def load(self, ckpt_dir: Path) -> None:
        self.server.load(str(ckpt_dir))

    def shutdown(self) -> None:
        pass


class _RayBackend:
    """A server actor and a pool of worker actors; data put in the store once."""

    def __init__(self, scenario: Scenario, data: FederatedData, workers: int) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        res = scenario.resources
        self.data_ref = ray.put(data)
        name = f"fedsim-server-{uuid.uuid4().hex[:12]}"
        # By default the server (aggregation and evaluation) runs on the
        # driver's node, so that it reads and writes checkpoints in the run
        # directory the driver sees; `resources.server_cpus` reserves CPUs for
        # it, and `server_node: any` lets Ray place it (shared storage needed).
        where: Any = "DEFAULT"
        if res.server_node == "driver":
            where = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False
            )
        server_cls = ray.remote(ServerCore).options(
            num_cpus=res.server_cpus, name=name, scheduling_strategy=where
        )
        self.server = server_cls.remote(scenario, [self.data_ref], 1)
        self.pool = RayPool(
            scenario, name, workers, res.cpus_per_worker, res.gpus_per_worker
        )
        self.workers = workers
        self.stateful = scenario.algorithm.stateful

    def run_round(
        self,
        tasks: list[Task],
        do_eval: bool,
        multiplicity: dict[int, int] | None = None,
    ) -> RoundResult:
        import ray

        payload_ref = self.server.payload.remote()
        # Each actor's share of the client states: read before round.remote
        # (calls from one caller to an actor run in order).
        states_for = self.server.client_states.remote if self.stateful else None
        refs = self.pool.train(payload_ref, tasks, states_for)
        return ray.get(
            self.server.round.remote(*refs, do_eval=do_eval, multiplicity=multiplicity)
        )

    def num_params(self) -> int:
        return int(self.params().numel())

    def params(self) -> torch.Tensor:
        import ray

        return ray.get(self.server.params.remote())

    def save(self, ckpt_dir: Path) -> None:
        import ray

        ray.get(self.server.save.remote(str(ckpt_dir)))

    def load(self, ckpt_dir: Path) -> None:
        import ray

        ray.get(self.server.load.remote(str(ckpt_dir)))

    def shutdown(self) -> None:
        import ray

        self.pool.shutdown()
        ray.kill(self.server)


def resolve_workers(scenario: Scenario, override: int | None) -> int:
    """Number of worker actors: the override, the scenario, or one per CPU."""
    if override is not None:
        return override
    w = scenario.resources.workers
    if w != "auto":
        return int(w)
    import ray

    cpus = ray.cluster_resources().get("CPU", 1.0) if ray.is_initialized() else 1.0
    return max(1, int(cpus // scenario.resources.cpus_per_worker))


RoundCallback = Callable[[dict[str, Any], list[dict[str, Any]]], None]


class Simulation:
    """One run of a scenario: fleet, clock, selector, workers, server.

    Args:
        scenario: the validated scenario.
        workers: 0 trains in this process without Ray; ``n >= 1`` uses ``n``
            Ray worker actors (Ray must be initialised).
        on_round: called with each round's row and client rows as soon as
            they are known (the CLI shows progress from it).
        run_dir: if given, rows are written there as Parquet (atomically, as
            the run goes) and checkpoints every ``checkpoint.every_rounds``.
        resume: continue from ``run_dir``'s latest checkpoint.

    Example:
        >>> from fedsim.scenario import load_scenario
        >>> sc = load_scenario("scenarios/quickstart.yaml", ["rounds=2"])
        >>> rows, clients = Simulation(sc, workers=0).run()
        >>> [r["round"] for r in rows]
        [0, 1]
    """

    def __init__(
        self,
        scenario: Scenario,
        workers: int = 0,
        on_round: RoundCallback | None = None,
        run_dir: Path | None = None,
        resume: bool = False,
    ) -> None:
        self.scenario = scenario
        self.workers = workers
        self.on_round = on_round
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.resume = resume
        self.recorder = Recorder(self.run_dir)
        self.fleet = Fleet.from_spec(scenario.fleet, scenario.seed)
        self.data = build_data(scenario.data, scenario.num_clients, scenario.seed)
        self.selector = make_selector(scenario.selector)
        # Over-selection: ask for ceil(over_select * k), keep the first k arrivals.
        self.keep: int | None = None
        if scenario.round.over_select > 1:
            k = scenario.selector.clients_per_round
            asked = math.ceil(round(scenario.round.over_select * k, 9))
            self.keep = k
            self.selector = replace(
                self.selector, clients_per_round=min(asked, self.fleet.size)
            )
        self.group_names = np.array(self.fleet.group_names, dtype=object)
        self.final_params: torch.Tensor | None = None
        self.backend: _LocalBackend | _RayBackend | None = None

    def _rng(self, tag: int, round_: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence([self.scenario.seed, tag, round_])
        )

    def run(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Run every (remaining) round; return (round rows, client rows)."""
        sc = self.scenario
        if self.workers == 0:
            self.backend = _LocalBackend(sc, self.data)
        else:
            self.backend = _RayBackend(sc, self.data, self.workers)
        try:
            self._loop(self.backend)
            self.final_params = self.backend.params()
            return self.recorder.rows, self.recorder.clients
        finally:
            try:
                self.recorder.flush()
            finally:  # the actors go even when the disk is full
                self.backend.shutdown()

    def _checkpoint(self, backend: Any, next_round: int, now: float, sel: Any) -> None:
        assert self.run_dir is not None
        self.recorder.flush()
        ckpt = checkpoint_dir(self.run_dir, next_round)
        backend.save(ckpt)
        write_meta(
            ckpt,
            {
                "next_round": next_round,
                "sim_time": now,
                "selector_state": sel,
                "n_rows": len(self.recorder.rows),
                "n_client_rows": len(self.recorder.clients),
                "n_selector_rows": len(self.recorder.selector_rows),
            },
        )
        commit_checkpoint(self.run_dir, ckpt)

    def _restore(self, backend: Any) -> tuple[int, float, Any]:
        assert self.run_dir is not None
        ck = latest_checkpoint(self.run_dir)
        backend.load(ck.path)
        self.recorder.load(ck.n_rows, ck.n_client_rows, ck.n_selector_rows)
        return ck.next_round, ck.sim_time, ck.selector_state

    def _round_row(
        self, t: int, plan: clock.RoundPlan, res: RoundResult, wall_s: float
    ) -> dict[str, Any]:
        """rounds.parquet's row; tau statistics over the updates that arrived."""
        done = [p for p in plan.plans if not p.dropped]
        taus = np.array([p.tau for p in done], dtype=np.float64)
        nan = float("nan")
        return {
            "round": t,
            "sim_time": plan.t_end,
            "wall_time": wall_s,
            "test_loss": res.test_loss,
            "test_accuracy": res.test_accuracy,
            "train_loss": res.train_loss,
            "n_selected": len(plan.plans),
            "n_completed": len(done),
            "n_dropped": len(plan.plans) - len(done),
            "tau_mean": float(taus.mean()) if len(taus) else nan,
            "tau_min": float(taus.min()) if len(taus) else nan,
            "tau_max": float(taus.max()) if len(taus) else nan,
            "tau_eff": res.info.tau_eff,
            "chi2_pw": res.info.chi2_pw,
        }

    def _client_rows(
        self,
        t: int,
        plan: clock.RoundPlan,
        res: RoundResult,
        bytes_down: int,
        bytes_up: int,
    ) -> list[dict[str, Any]]:
        """clients.parquet's rows: one per selected client, plus the
        algorithm's per-client flag columns."""
        rows = []
        for p in plan.plans:
            st = res.clients.get(p.client)
            up = bytes_up if st is None or st.bytes_up is None else st.bytes_up
            if p.dropped:
                up = 0
            rows.append(
                {
                    "round": t,
                    "client_id": p.client,
                    "device_group": str(self.group_names[self.fleet.group[p.client]]),
                    "tau": p.tau,
                    "t_start": p.t_start,
                    "t_arrive": p.t_arrive,
                    "dropped": p.dropped,
                    "drop_reason": p.reason,
                    "slowdown": p.slowdown,
                    "weight": st.weight if st else 0.0,
                    "update_norm": st.update_norm if st else float("nan"),
                    "train_loss": st.train_loss if st else float("nan"),
                    "bytes_down": bytes_down,
                    "bytes_up": up,
                    **(st.flags if st else {}),
                }
            )
        return rows

    def _loop(self, backend: Any) -> None:
        sc = self.scenario
        d = backend.num_params()
        elem = sc.model.elem_bytes
        bytes_down = sc.algorithm.down_factor * d * elem
        bytes_up = sc.algorithm.up_factor * d * elem
        n_samples = self.data.n_samples
        sel_ctx = SelectorContext.from_run(
            self.fleet, n_samples, sc.round, sc.client.batch_size, bytes_down, bytes_up
        )
        sel_state = self.selector.init(sel_ctx)
        start, now = 0, 0.0
        if self.resume:
            start, now, sel_state = self._restore(backend)
        every = sc.checkpoint.every_rounds if self.run_dir is not None else 0
        wall0 = time.perf_counter()
        for t in range(start, sc.rounds):
            now = self.fleet.next_online_time(now)
            online = np.flatnonzero(self.fleet.online(now))
            chosen, sel_state = self.selector.select(
                sel_state, t, online, self._rng(_SELECT_TAG, t), sel_ctx
            )
            multiplicity = self.selector.multiplicity(sel_state, chosen)
            plan = clock.plan_round(
                self.fleet,
                chosen,
                now,
                sc.round,
                self._rng(_CLOCK_TAG, t),
                bytes_down,
                bytes_up,
                n_samples,
                sc.client.batch_size,
                keep=self.keep,
            )
            tasks = [Task(p.client, t, p.tau) for p in plan.plans if not p.dropped]
            do_eval = evaluates(sc, t)
            res = backend.run_round(tasks, do_eval, multiplicity)
            if not math.isfinite(res.train_loss) and tasks:
                raise DivergenceError(
                    f"round {t}: the training loss is {res.train_loss}"
                )
            sel_state = self.selector.observe(sel_state, t, res, sel_ctx)
            row = self._round_row(t, plan, res, time.perf_counter() - wall0)
            these = self._client_rows(t, plan, res, bytes_down, bytes_up)
            artifact = [{"round": t, **r} for r in self.selector.artifact(sel_state, t)]
            self.recorder.add(row, these, artifact)
            if self.on_round is not None:
                self.on_round(row, these)
            now = plan.t_end
            if every and ((t + 1) % every == 0 or t + 1 == sc.rounds):
                self._checkpoint(backend, t + 1, now, sel_state)
