"""Batched local training: the K clients of a round trained together.

A small model's local step costs less than the dispatch around it, so the
clients a worker gets for one round are stacked into one ``[K, d]`` tensor
and each local step is one ``vmap`` of ``grad`` over the stack (or, for dense
stacks, hand-written batched matrix products), then the solver step. What
stays per client, what is not batched and how close the results are to
sequential training: docs/architecture.md, "Runtime on Ray". Scenarios opt in
with ``resources.vectorize: true``.

The module reads the worker's public attributes (model, data, device) and
asks the solver and the algorithm through their public interface:
``SGD.stacks`` / ``step_rows`` / ``lr_at`` / ``row_buffer`` / ``plain``, and
``Algorithm.stacked_grad_hook``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fedsim.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientInfo,
    ClientState,
    ClientUpdate,
    StackedHook,
)
from fedsim.minibatches import client_seed, first_batches
from fedsim.models import Loss
from fedsim.solvers import SGD, SolverState
from fedsim.tasks import Payload, Task, WorkerSetup

States = Mapping[int, ClientState]


class Worker(Protocol):
    """What batched training reads of its :class:`fedsim.workers.Worker`:
    described here, not imported, since that module imports this one.

    Every member is public on the worker, and this module only reads them
    (never the worker's private state): a worker that keeps these promises
    can be trained batched, and a change inside the worker cannot silently
    change what the batched path computes.
    """

    # the worker's set-up record: the model's name for why_not_batched
    setup: WorkerSetup
    # the model's own per-sample loss (None: cross-entropy)
    loss: Loss | None
    # the run seed: each client's minibatch order is drawn from (seed,
    # round, client), exactly as the sequential path draws it
    seed: int
    # the minibatch size B of client.batch_size
    batch_size: int
    # the algorithm's client hooks (start_client, stacked_grad_hook, finish)
    algorithm: Algorithm
    # the round-0 solver: whether its rule stacks (SGD.stacks)
    solver: SGD
    # the worker's network: vmap calls it functionally on stacked parameters
    model: nn.Module
    # where the worker trains (a recurrent model stacks on the CPU only)
    device: torch.device
    # the model's flat parameter vector, which the stack's rows replace
    theta: Tensor
    # every client's samples, concatenated in client order
    x: Tensor
    y: Tensor
    # client i's samples are x[offsets[i]:offsets[i + 1]]
    offsets: list[int]

    # the solver with round ``round_``'s learning rate (decay and steps)
    def solver_for(self, round_: int) -> SGD: ...
    # the facts a client's hooks receive (its id, samples, weight)
    def client_info(self, i: int) -> ClientInfo: ...
    # the update a client uploads, made as the sequential path makes it
    def client_update(
        self,
        task: Task,
        client: ClientContext,
        delta: Tensor,
        done: SolverState,
        loss_sum: float,
    ) -> ClientUpdate: ...
    # the fallback: the same tasks trained one client after another
    def train_sequential(
        self, payload: Payload, tasks: Sequence[Task], states: States
    ) -> list[ClientUpdate]: ...


# (theta [n, d], x, y, w, count) -> (gradients [n, d], losses [n])
GradFn = Callable[..., tuple[Tensor, Tensor]]


def why_not_batched(worker: Worker) -> str | None:
    """Why this worker cannot train its clients together.

    Args:
        worker: the worker as built (algorithm, model, solver, device).

    Returns:
        A reason to log once (the worker then trains one client at a time),
        or None when batched training gives the sequential results.
    """
    algo, model = worker.algorithm, worker.model
    if algo.client_train is not None:
        return f"algorithm {algo.name!r} trains its clients with its own procedure"
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return "the model has BatchNorm layers (running statistics)"
    recurrent = any(isinstance(m, nn.RNNBase) for m in model.modules())
    if recurrent and worker.device.type != "cpu":  # cuDNN RNNs: no vmap rule
        return f"model {worker.setup.network.model.name!r} is recurrent, on a GPU"
    if not worker.solver.stacks:
        return f"solver {type(worker.solver).__name__} has no batched step"
    return None


def train_batched(
    worker: Worker, payload: Payload, tasks: Sequence[Task], states: States
) -> list[ClientUpdate]:
    """Train ``tasks`` from one payload, the tasks of each round together.

    Args:
        worker: a worker for which :func:`why_not_batched` is None.
        payload: what the clients download (its ``x`` is the start).
        tasks: the clients to train, each for its ``tau`` steps.
        states: persistent client states by id (missing: ``{}``).

    Returns:
        One update per task, in task order. Rounds are trained apart
        because each round has its own learning rate.
    """
    out: dict[int, ClientUpdate] = {}
    for r in sorted({t.round for t in tasks}):
        idx = [j for j, t in enumerate(tasks) if t.round == r]
        group = [tasks[j] for j in idx]
        ups = _train_together(worker, payload, group, states)
        out.update(zip(idx, ups, strict=True))
    return [out[j] for j in range(len(tasks))]


def _batch_indices(
    worker: Worker, tasks: Sequence[Task], steps: int
) -> tuple[Tensor, Tensor]:
    """[K, steps, B] absolute row indices and [K, steps, B] row weights (0:
    padding), from each client's own generator, as the sequential loop.

    A client with at most B samples uses all its rows at every step (as the
    sequential loop's full batch), padded with weight-0 rows; the others
    draw the same minibatches the sequential loop would, from the same seed.
    """
    batch = worker.batch_size
    idx = torch.zeros((len(tasks), steps, batch), dtype=torch.long)
    wts = torch.zeros((len(tasks), steps, batch), dtype=worker.theta.dtype)
    for j, t in enumerate(tasks):
        lo, hi = worker.offsets[t.client], worker.offsets[t.client + 1]
        n = hi - lo
        if n <= batch:  # every step uses every row, padded with weight 0
            idx[j, : t.tau, :n] = torch.arange(lo, hi)
            wts[j, : t.tau, :n] = 1.0
        elif t.tau:
            seed = client_seed(worker.seed, t.round, t.client)
            gen = torch.Generator().manual_seed(seed)
            idx[j, : t.tau] = first_batches(n, batch, t.tau, gen) + lo
            wts[j, : t.tau] = 1.0
    return idx.to(worker.device), wts.to(worker.device)


def _grad_fn(
    model: nn.Module, own: Loss | None
) -> Callable[..., tuple[Tensor, Tensor]]:
    """``f(theta [K, d], x [K, B, ...], y [K, B], w [K, B], count [K])`` ->
    (gradients [K, d], losses [K]) of each client's weighted mean loss (the
    model's own per-sample loss ``own``, or cross-entropy)."""
    named = dict(model.named_parameters())
    sizes = [p.numel() for p in named.values()]

    def loss(
        theta: Tensor, x: Tensor, y: Tensor, w: Tensor, n: Any
    ) -> tuple[Tensor, Tensor]:
        parts = zip(named.items(), theta.split(sizes), strict=True)
        params = {k: v.view(p.shape) for (k, p), v in parts}
        out = functional_call(model, params, (x,))
        per = own(out, y) if own else F.cross_entropy(out, y, reduction="none")
        value = (per * w).sum() / n
        return value, value.detach()

    return vmap(grad(loss, has_aux=True))  # type: ignore[no-any-return]


def _dense_layers(model: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of a ``Flatten / Linear / ReLU`` stack (logreg, mlp),
    ReLU between each two; None for any other model."""
    if not isinstance(model, nn.Sequential):
        return None
    linears = [m for m in model if isinstance(m, nn.Linear)]
    body = [type(m) for m in model if type(m) is not nn.Flatten]
    expected = [nn.Linear, nn.ReLU] * (len(linears) - 1) + [nn.Linear]
    return linears if linears and body == expected else None


def _relu_back(grad: Tensor, out: Tensor) -> Tensor:
    """``grad * (out > 0)`` in one pass (the kernel autograd uses for relu)."""
    return torch.ops.aten.threshold_backward(grad, out, 0)  # type: ignore[no-any-return]


def _dense_params(
    layers: list[nn.Linear], theta: Tensor
) -> list[tuple[Tensor, Tensor]]:
    """Each layer's (W [K, out, in], b [K, out]): views of the stack's rows."""
    out, offset, k = [], 0, theta.shape[0]
    for layer in layers:
        n_w = layer.out_features * layer.in_features
        w = theta[:, offset : offset + n_w].view(k, layer.out_features, -1)
        offset += n_w + layer.out_features
        out.append((w, theta[:, offset - layer.out_features : offset]))
    return out


def _dense_fn(layers: list[nn.Linear]) -> Callable[..., Any]:
    """:func:`_grad_fn` for a dense stack, by batched matrix products and a
    hand-written backward pass (docs/architecture.md, "Runtime on Ray") on
    :func:`_dense_params`' stacks; given ``lr``, it takes the SGD step itself,
    in place, and returns no gradients (they are most of the memory traffic)."""

    def fn(params, x, y, w, count, lr=None):  # type: ignore[no-untyped-def]
        weights, biases = [p[0] for p in params], [p[1] for p in params]
        h = x.reshape(len(x), x.shape[1], -1)
        inputs = []
        for i, (wl, b) in enumerate(params):
            if i:
                h = h.relu_()  # h is this step's own tensor
            inputs.append(h)
            h = torch.baddbmm(b.unsqueeze(1), h, wl.transpose(1, 2))
        # softmax and the loss by hand: log_softmax over a short last axis
        # costs more than these few passes
        z = h - h.amax(2, keepdim=True)
        e = z.exp()
        total = e.sum(2, keepdim=True)
        nll = (total.log() - z.gather(2, y.unsqueeze(2))).squeeze(2)
        dz = e.div_(total)
        dz.scatter_add_(2, y.unsqueeze(2), -torch.ones_like(dz[..., :1]))
        dz.mul_((w / count.unsqueeze(1)).unsqueeze(2))
        grads: list[Tensor] = []
        for i in range(len(params) - 1, -1, -1):
            a = inputs[i]
            # a = relu(z_{i-1}): the gradient passes where a > 0
            below = _relu_back(torch.bmm(dz, weights[i]), a) if i else None
            if lr is None:
                grads[:0] = [torch.bmm(dz.transpose(1, 2), a).flatten(1), dz.sum(1)]
            else:
                weights[i].baddbmm_(dz.transpose(1, 2), a, alpha=-lr)
                biases[i].add_(dz.sum(1), alpha=-lr)
            dz = below
        loss = (nll * w).sum(dim=1) / count
        return (torch.cat(grads, dim=1) if lr is None else None), loss

    return fn


def _train_together(
    worker: Worker, payload: Payload, tasks: Sequence[Task], states: States
) -> list[ClientUpdate]:
    """Train every task's client (one round, one payload) at once.

    Clients are stacked longest tau first, so the clients still training at
    step s are the first n_s rows: a slice (a view), with no index tensors
    and no host synchronisation in the step loop. A task alone goes through
    the sequential loop (nothing to stack). ``start_client`` and
    ``client_finish`` run per client, exactly as in the sequential loop;
    ||a_i||_1 comes from the solver's closed form.

    Returns:
        One update per task, in the given task order.
    """
    if len(tasks) == 1:
        return worker.train_sequential(payload, tasks, states)
    order = sorted(range(len(tasks)), key=lambda j: -tasks[j].tau)  # stable
    tasks = [tasks[j] for j in order]
    dev = worker.device
    payload = {k: v.to(dev) for k, v in payload.items()}
    x_global = payload["x"]
    solver = worker.solver_for(tasks[0].round)
    clients = [
        worker.algorithm.start_client(
            worker.client_info(t.client),
            payload,
            {k: v.to(dev) for k, v in states.get(t.client, {}).items()},
        )
        for t in tasks
    ]
    theta = x_global.unsqueeze(0).repeat(len(tasks), 1)
    hook = worker.algorithm.stacked_grad_hook(clients)
    loss_sum = _run_steps(worker, tasks, solver, hook, theta, x_global)
    ups = []
    for j, t in enumerate(tasks):
        done = SolverState(x_global, solver.lr, t.tau, solver.norm_a(t.tau))
        delta, loss = theta[j] - x_global, float(loss_sum[j])
        ups.append(worker.client_update(t, clients[j], delta, done, loss))
    return [u for _, u in sorted(zip(order, ups, strict=True))]  # task order again


def _run_steps(
    worker: Worker,
    tasks: Sequence[Task],
    solver: SGD,
    hook: StackedHook | None,
    theta: Tensor,
    x_global: Tensor,
) -> Tensor:
    """Take every local step of the stack ``theta`` ([K, d], in place).

    Args:
        worker: the worker (model, data, device).
        tasks: the stacked tasks, longest tau first (row j: ``tasks[j]``).
        solver: the round's solver; ``step_rows`` applies its rule.
        hook: the algorithm's stacked gradient hook, or None.
        theta: the stack, starting at ``x_global`` in every row.
        x_global: the round's starting parameters.

    Returns:
        Each row's sum of minibatch losses (float64, [K]).
    """
    idx, wts = _batch_indices(worker, tasks, tasks[0].tau)
    counts = wts.sum(dim=2).clamp(min=1.0)  # [K, steps] real rows per batch
    loss_sum = torch.zeros(len(tasks), dtype=torch.float64, device=worker.device)
    # the hand-written pass is cross-entropy's: a model's own loss goes by vmap
    layers = (_dense_layers(worker.model) if worker.loss is None else None) or []
    clip = solver.clip_norm
    # a plain rule on a dense stack: the step is taken inside the backward pass
    fused = hook is None and solver.plain and not solver.weight_decay
    if layers and fused and clip is None:
        _fused_steps(worker, tasks, solver, layers, theta, idx, wts, counts, loss_sum)
        return loss_sum
    # the solver's own clip takes one norm over its whole argument: each
    # row's gradient is clipped here instead, and the solver steps unclipped
    solver = replace(solver, clip_norm=None)
    buf = solver.row_buffer(theta)
    grad_fn = _grad_for(worker.model, worker.loss, layers)
    for s, n in enumerate(_still_training(tasks)):
        rows, th = idx[:n, s], theta[:n]
        batch = (worker.x[rows], worker.y[rows], wts[:n, s], counts[:n, s])
        g, loss = grad_fn(th, *batch)
        if hook is not None:
            hook(n, th, g)
        if clip is not None:  # after the hook, before weight decay: as step()
            clip_rows(g, clip)
        solver.step_rows(s, th, g, x_global, None if buf is None else buf[:n])
        loss_sum[:n] += loss.double()
    return loss_sum


def clip_rows(g: Tensor, max_norm: float) -> None:
    """Clip each row of ``g`` ([n, d], in place) to L2 norm ``max_norm``, as
    :func:`fedsim.solvers.clip_gradient` clips one client's gradient: row j
    is scaled by min(1, max_norm / (||g_j||_2 + 1e-6)).

    Args:
        g: the stacked gradients, one client a row (changed in place).
        max_norm: the largest norm a row keeps (``client.clip_norm``).

    >>> g = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    >>> clip_rows(g, 1.0)
    >>> g
    tensor([[0.6000, 0.8000],
            [0.3000, 0.4000]])
    """
    norms = torch.linalg.vector_norm(g, dim=1, keepdim=True)
    # a row within the bound is multiplied by exactly 1 (clip_gradient: no-op)
    g.mul_((max_norm / (norms + 1e-6)).clamp_(max=1.0))


def _still_training(tasks: Sequence[Task]) -> list[int]:
    """For each step s, how many of the stacked clients (longest tau first)
    still train: the stack's first n_s rows."""
    return [sum(t.tau > s for t in tasks) for s in range(tasks[0].tau)]


def _grad_for(model: nn.Module, own: Loss | None, layers: list[nn.Linear]) -> GradFn:
    """The stacked gradient function: the hand-written dense pass when the
    model is a dense stack (``layers``), else ``vmap`` of ``grad`` of the
    model's loss (its own ``own``, or cross-entropy)."""
    if not layers:
        return _grad_fn(model, own)
    dense = _dense_fn(layers)
    return lambda th, *batch: dense(_dense_params(layers, th), *batch)  # type: ignore[no-any-return]


def _fused_steps(
    worker: Worker,
    tasks: Sequence[Task],
    solver: SGD,
    layers: list[nn.Linear],
    theta: Tensor,
    idx: Tensor,
    wts: Tensor,
    counts: Tensor,
    loss_sum: Tensor,
) -> None:
    """:func:`_run_steps` for a plain rule (``solver.plain``) on a dense
    stack: each step is taken inside the hand-written backward pass, on
    contiguous copies of the layers (the stack's views are strided), which
    are written back into ``theta`` after the last step."""
    dense = _dense_fn(layers)
    views = _dense_params(layers, theta)
    own = [(w.clone(), b.clone()) for w, b in views]
    for s, n in enumerate(_still_training(tasks)):
        rows = idx[:n, s]
        batch = (worker.x[rows], worker.y[rows], wts[:n, s], counts[:n, s])
        stack = [(w[:n], b[:n]) for w, b in own]
        _, loss = dense(stack, *batch, lr=solver.lr_at(s))
        loss_sum[:n] += loss.double()
    for (w, b), (w_own, b_own) in zip(views, own, strict=True):
        w.copy_(w_own)
        b.copy_(b_own)
