"""Vectorised local training: many clients of a small model in one computation.

For small models (logistic regression, MLPs) a local step costs less than the
Python and dispatch overhead around it, so training clients one after another
leaves the CPU idle. Here the K clients a worker was given train *together*:
their parameters are stacked into one ``[K, d]`` tensor and each local step is
a single batched forward and backward pass over per-client
minibatches gathered with each client's own generator (the same batches as
sequential training), through batched matrix products (``torch.baddbmm``)
with autograd: the clients' losses are summed, so each client's slice of the
gradient is its own gradient. Clients with fewer steps are masked once they finish,
and clients with fewer samples than a batch use all their rows (padded rows
have weight 0).

Results equal sequential training within float tolerance (the reductions are
batched differently), which ``tests/test_vectorized.py`` checks. It applies
to stateless algorithms with the standard local loop (FedAvg, FedProx,
FedNova, FedAvgM, FedAdam, FedBuff, FedAsync; ``client_finish`` still runs per
client) and the solvers sgd, momentum, prox and decay; the scenario opts in
with ``resources.vectorize: true``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedsim.algorithms.base import Algorithm, ClientContext, ClientState, ClientUpdate
from fedsim.solvers import Momentum, Prox, SolverState

if TYPE_CHECKING:
    from fedsim.workers import Task, Worker

__all__ = ["supports", "train_vectorized"]

_SMALL_MODELS = ("logreg", "mlp")


def supports(worker: Worker) -> bool:
    """Whether this worker's algorithm, solver and model can be vectorised."""
    algo = worker.algorithm
    cls = type(algo)
    standard = (
        algo.client_train is None
        and not algo.stateful
        and cls.local_setup is Algorithm.local_setup
        and cls.grad_hook is Algorithm.grad_hook
    )
    return (
        standard
        and worker.scenario.model.name in _SMALL_MODELS
        and worker.x.device.type == "cpu"
    )


def _batch_indices(worker: Worker, tasks: Sequence[Task], steps: int) -> tuple:
    """[K, steps, B] row indices (absolute) and [K, steps, B] row weights."""
    from fedsim.minibatches import batches as _batches
    from fedsim.minibatches import client_seed

    batch = worker.scenario.client.batch_size
    k = len(tasks)
    idx = torch.zeros((k, steps, batch), dtype=torch.long)
    wts = torch.zeros((k, steps, batch), dtype=worker.theta.dtype)
    for j, t in enumerate(tasks):
        if t.tau == 0:
            continue
        lo, hi = worker.offsets[t.client], worker.offsets[t.client + 1]
        n = hi - lo
        seed = client_seed(worker.scenario.seed, t.round, t.client)
        it = _batches(n, batch, torch.Generator().manual_seed(seed))
        if n <= batch:  # every step uses every row, padded with weight 0
            idx[j, : t.tau, :n] = torch.arange(lo, hi)
            wts[j, : t.tau, :n] = 1.0
        else:
            rows = [next(it) for _ in range(t.tau)]  # never None: n > batch
            idx[j, : t.tau] = torch.stack(rows) + lo  # type: ignore[arg-type]
            wts[j, : t.tau] = 1.0
    return idx, wts


def _batched_forward(
    model: nn.Module, theta: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """Logits of K clients at once: ``theta`` [K, d], ``x`` [K, B, ...].

    Interprets the model's ``nn.Sequential`` of Flatten / Linear / ReLU layers
    with batched matrix products, each client using its own slice of theta.
    """
    k = theta.shape[0]
    h = x.reshape(k, x.shape[1], -1)
    offset = 0
    for layer in model.children():
        if isinstance(layer, nn.Flatten):
            continue
        if isinstance(layer, nn.ReLU):
            h = torch.relu(h)
            continue
        assert isinstance(layer, nn.Linear)
        n_w = layer.out_features * layer.in_features
        w = theta[:, offset : offset + n_w].view(
            k, layer.out_features, layer.in_features
        )
        offset += n_w
        b = theta[:, offset : offset + layer.out_features].unsqueeze(1)
        offset += layer.out_features
        h = torch.baddbmm(b, h, w.transpose(1, 2))
    return h


@dataclass(frozen=True)
class _Minibatch:
    """One local step's minibatches of K clients.

    Attributes:
        x: [K, B, ...] samples.
        y: [K, B] labels.
        w: [K, B] row weights (0: padding).
        count: [K] real rows per client (at least 1).
    """

    x: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor
    count: torch.Tensor


def _linear_grad(
    model: nn.Module, theta: torch.Tensor, batch: _Minibatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form gradient and loss of K logistic regressions (no autograd).

    With logits z = x W^T + b and masked mean cross-entropy, dL/dz =
    (softmax(z) - onehot(y)) * w / count, so grad W = (dL/dz)^T x and
    grad b = sum over rows of dL/dz.
    """
    (layer,) = [m for m in model.children() if isinstance(m, nn.Linear)]
    x, y, w, count = batch.x, batch.y, batch.w, batch.count
    k, out_f, in_f = theta.shape[0], layer.out_features, layer.in_features
    h = x.reshape(k, x.shape[1], -1)
    weight = theta[:, : out_f * in_f].view(k, out_f, in_f)
    bias = theta[:, out_f * in_f :].unsqueeze(1)
    z = torch.baddbmm(bias, h, weight.transpose(1, 2))
    logp = torch.log_softmax(z, dim=2)
    nll = -logp.gather(2, y.unsqueeze(2)).squeeze(2)
    scale = (w / count.unsqueeze(1)).unsqueeze(2)
    dz = logp.exp()
    dz.scatter_add_(2, y.unsqueeze(2), -torch.ones_like(nll).unsqueeze(2))
    dz.mul_(scale)
    g = torch.cat([torch.bmm(dz.transpose(1, 2), h).reshape(k, -1), dz.sum(1)], dim=1)
    loss = (nll * w).sum(dim=1) / count
    return g, loss


def _autograd_grad(
    model: nn.Module, theta: torch.Tensor, batch: _Minibatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient and loss of K models through one batched autograd pass."""
    leaf = theta.detach().requires_grad_(True)
    logits = _batched_forward(model, leaf, batch.x)
    per = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch.y.reshape(-1), reduction="none"
    ).view(theta.shape[0], -1)
    # each client's masked mean loss; summing them keeps gradients separate
    loss = (per * batch.w).sum(dim=1) / batch.count
    (g,) = torch.autograd.grad(loss.sum(), leaf)
    return g, loss.detach()


def train_vectorized(
    worker: Worker,
    payload: dict[str, torch.Tensor],
    tasks: Sequence[Task],
    states: Mapping[int, ClientState],
) -> list[ClientUpdate]:
    """A worker's group of tasks, in task order: the tasks of each round
    (one learning rate) together, a task alone through the sequential loop."""
    out: dict[int, ClientUpdate] = {}
    for r in sorted({t.round for t in tasks}):
        idx = [j for j, t in enumerate(tasks) if t.round == r]
        group = [tasks[j] for j in idx]
        if len(group) == 1:
            ups = worker._sequential(payload, group, states)
        else:
            ups = _train_together(worker, payload["x"], group)
        out.update(zip(idx, ups, strict=True))
    return [out[j] for j in range(len(tasks))]


def _train_together(
    worker: Worker, x_global: torch.Tensor, tasks: Sequence[Task]
) -> list[ClientUpdate]:
    """Train every task's client (one round) from ``x_global`` at once."""
    model, solver = worker.model, worker.solver_for(tasks[0].round)
    k = len(tasks)
    taus = torch.tensor([t.tau for t in tasks])
    steps = int(taus.max())
    idx, wts = _batch_indices(worker, tasks, steps)
    counts = wts.sum(dim=2).clamp(min=1.0)  # [K, steps] real rows per batch
    theta = x_global.unsqueeze(0).repeat(k, 1)
    x0 = theta.clone()
    buf = torch.zeros_like(theta)
    loss_sum = torch.zeros(k, dtype=torch.float64)
    lr, wd = solver.lr, solver.weight_decay
    gamma = getattr(solver, "gamma", 1.0)
    linear = sum(isinstance(m, nn.Linear) for m in model.children()) == 1
    grad_fn = _linear_grad if linear else _autograd_grad
    for s in range(steps):
        active = (taus > s).to(theta.dtype).unsqueeze(1)
        rows = idx[:, s]
        batch = _Minibatch(worker.x[rows], worker.y[rows], wts[:, s], counts[:, s])
        g, loss = grad_fn(model, theta, batch)
        loss_sum += loss.double() * active.squeeze(1).double()
        if wd:
            g = g + wd * theta
        if isinstance(solver, Momentum):
            buf = torch.where(active > 0, solver.rho * buf + g, buf)
            direction = buf
        elif isinstance(solver, Prox) and solver.mu:
            direction = g + solver.mu * (theta - x0)
        else:
            direction = g
        theta = theta - (lr * gamma**s) * active * direction  # decay: lr gamma^k
    updates = []
    payload = {"x": x_global}
    for j, t in enumerate(tasks):
        delta = theta[j] - x_global
        done = SolverState(
            x0=x_global, lr=solver.lr, steps=t.tau, norm_a=solver.norm_a(t.tau)
        )
        info = worker.client_info(t.client)
        client = ClientContext(info, payload)
        extras, _ = worker.algorithm.client_finish(delta, done, client)
        updates.append(
            ClientUpdate(
                client=t.client,
                delta=delta,
                weight=float(worker.weights[t.client]),
                tau=t.tau,
                norm_a=done.norm_a,
                train_loss=float(loss_sum[j]) / max(t.tau, 1),
                extras=extras,
            )
        )
    return updates
