"""FedDM: federated learning with distribution matching.

FedDM: Iterative Distribution Matching for Communication-Efficient Federated
Learning. Yuanhao Xiong, Ruochen Wang, Minhao Cheng, Felix Yu, Cho-Jui Hsieh.
CVPR 2023. arXiv:2207.09653.

docs/algorithms.md section 10. Instead of a model update, client k sends a synthetic
set S_k (``ipc`` samples per class it holds, relearnt every round) whose mean
embedding h and logits z match those of its real batches at models
w~ = w_r + eps min(1, rho / ||eps||) around the global model:

    L = sum_c ||mean h(real_c) - mean h(S_c)||^2 + ||mean z(real_c) - mean z(S_c)||^2

The server trains w_r on the union of the S_k. Models, DP, weights and what
the clock charges: docs/fedpns-feddm.md.

Where things happen: :meth:`FedDM.client_train` learns S_k on a worker (its
own procedure in place of local SGD; DP through :meth:`FedDM._dp_gradient`),
:meth:`FedDM.aggregate` trains the global model on the server's copy of the
network, and :meth:`FedDM.clock_work` tells the clock what a client's matching
costs in local-step equivalents and bytes. Every random draw comes from the
job's generator (clients) or a seed derived from the initial model (server),
so a run is a pure function of (scenario, seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

import fedsim.algorithms.base as base
from fedsim.algorithms.base import PLAIN_ROUND, RoundContext, ServerState, Updates
from fedsim.algorithms.weighting import Beta, updates_tau_eff
from fedsim.lazy import F, nn, torch
from fedsim.spec import NonNegFloat, PosFloat, PosInt, Problem

if TYPE_CHECKING:
    from fedsim.clock import JobWork
    from fedsim.data.base import DataInfo, FederatedData
    from fedsim.facts import RunFacts


def embed_and_logits(
    model: nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, z): the penultimate embedding and the logits of ``model`` on ``x``.

    A model may define ``embed_and_logits(x)`` itself; otherwise h is the
    (flattened) input of its last ``nn.Linear``, which must produce the output.

    >>> m = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> h, z = embed_and_logits(m, torch.zeros(5, 4))
    >>> tuple(h.shape), tuple(z.shape)
    ((5, 3), (5, 2))
    """
    # the features matched are the model's own: the paper matches at the
    # current (perturbed) global model, so no separate extractor is trained
    own = getattr(model, "embed_and_logits", None)
    if callable(own):
        return own(x)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(
            f"FedDM needs a classifier ending in an nn.Linear layer; "
            f"{type(model).__name__} has none"
        )
    # a forward hook sees the last layer's input without knowing the
    # architecture; checked below to be the layer that gives the output
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = linears[-1].register_forward_hook(lambda mod, i, o: seen.append((i[0], o)))
    try:
        z = model(x)
    finally:
        handle.remove()
    if not seen or seen[-1][1] is not z:
        raise ValueError(
            f"FedDM: the last nn.Linear of {type(model).__name__} does not produce "
            "its output; define embed_and_logits(x) on the model"
        )
    return seen[-1][0].flatten(1), z


def matching_loss(
    model: nn.Module, real: Sequence[torch.Tensor], syn: Sequence[torch.Tensor]
) -> torch.Tensor:
    """The matching loss L of the module docstring, differentiable in ``syn``.

    Args:
        model: The network at the perturbed global model (its features h, z).
        real: Class c's real batch at ``real[c]``; constants (no gradient).
        syn: Class c's synthetic set at ``syn[c]``, in the same class order.

    Returns:
        A scalar: per class, the squared distance of the mean embeddings plus
        that of the mean logits, summed over the classes.
    """
    # real features are constants: only the synthetic samples are learnt
    with torch.no_grad():
        h_r, z_r = embed_and_logits(model, torch.cat(list(real)))
    h_s, z_s = embed_and_logits(model, torch.cat(list(syn)))
    nr, ns = [len(r) for r in real], [len(s) for s in syn]
    total = h_s.new_zeros(())
    classes = zip(
        h_r.split(nr), z_r.split(nr), h_s.split(ns), z_s.split(ns), strict=True
    )
    for hr, zr, hs, zs in classes:
        dh, dz = hr.mean(0) - hs.mean(0), zr.mean(0) - zs.mean(0)
        total = total + ((dh * dh).sum() + (dz * dz).sum())
    return total


def perturb(x: torch.Tensor, rho: float, gen: torch.Generator) -> torch.Tensor:
    """w~ = x + eps min(1, rho / ||eps||), eps ~ N(0, I): a model at most
    ``rho`` from ``x``, so the synthetic set matches around the global model.

    Args:
        x: The global model's flat parameters.
        rho: The radius of the ball the perturbation stays in.
        gen: The client's generator (one normal draw per parameter).
    """
    eps = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    # the norm in float64: float32 rounding would change the scale per device
    norm = float(torch.linalg.vector_norm(eps.to(torch.float64)))
    return x + (min(1.0, rho / norm) if norm > 0 else 0.0) * eps


def synthetic_size(classes_per_client: Sequence[int], ipc: int) -> int:
    """The server's synthetic dataset size: sum_k |C_k| ipc."""
    return int(sum(int(c) for c in classes_per_client)) * int(ipc)


def upload_bytes(
    n_classes: int,
    ipc: int,
    sample_shape: Sequence[int],
    float_bytes: int = 4,
    label_bytes: int = 8,
) -> int:
    """Bytes client k uploads: |C_k| ipc samples and their labels."""
    n = int(n_classes) * int(ipc)
    return n * int(np.prod(sample_shape)) * float_bytes + n * label_bytes


def iteration_flops_ratio(
    real_per_class: Sequence[int], ipc: int, batch_size: int
) -> float:
    """One matching iteration's compute in local SGD steps of ``batch_size``:
    (sum_c min(dc_batch_size, n_c) + 2 |C| ipc) / (3 B) in per-sample forward
    passes (docs/fedpns-feddm.md, "FedDM's cost")."""
    real = sum(int(r) for r in real_per_class)
    return (real + 2 * len(real_per_class) * int(ipc)) / (3 * int(batch_size))


def _stable_seed(x: torch.Tensor) -> int:
    """A seed for FedDM's server (tag 0xFEDD) from the initial parameters."""
    words = x.detach().to(torch.float64).reshape(-1)[:64].numpy().view(np.uint32)
    ss = np.random.SeedSequence([0xFEDD, *words.tolist()])
    return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class FedDM(base.Algorithm):
    """Clients send per-class synthetic sets; the server trains on their union.

    Fields (docs/algorithms.md 10.2 defaults) are explained in docs/fedpns-feddm.md.

    >>> alg = FedDM(ipc=2, iterations=3)
    >>> sorted(alg.init(torch.zeros(4), num_clients=3))
    ['round', 'seed', 'x']
    """

    name: Literal["feddm"] = "feddm"
    ipc: PosInt = 10  # synthetic images per class
    rho: PosFloat = 5.0  # radius of the perturbation around w_r
    image_lr: PosFloat = 1.0  # SGD on the synthetic pixels
    image_momentum: Beta = 0.5
    iterations: PosInt = 1000  # matching iterations per round
    dc_batch_size: PosInt = 256  # real samples per class and iteration
    image_init: Literal["auto", "real", "noise"] = "auto"  # auto: noise with DP
    server_epochs: PosInt = 500  # server SGD on the union of the S_k
    server_batch_size: PosInt = 256
    server_lr: PosFloat = 0.01
    server_momentum: Beta = 0.9
    server_weight_decay: NonNegFloat = 0.0
    ball: bool = False  # project every server step onto B_rho(w_r)
    dp_noise: NonNegFloat | None = None  # DP-SGD noise multiplier (None: no DP)
    dp_clip: PosFloat = 5.0  # DP-SGD per-example clipping bound
    # local steps of compute per iteration on the clock (auto: counted per client)
    iteration_cost: PosFloat | Literal["auto"] = "auto"

    # the server trains the global model on the synthetic sets
    server_needs: ClassVar[frozenset[str]] = frozenset({"model"})
    # clients send synthetic sets, not a model update: nothing to compress
    compressible: ClassVar[bool] = False

    def __post_init__(self) -> None:
        """Refuse real images as the start of a DP synthetic set."""
        if self.dp_noise is not None and self.image_init == "real":
            raise ValueError(
                "image_init 'real' publishes real images, which DP (dp_noise) is "
                "meant to protect; use image_init 'noise' (or 'auto')"
            )

    @property
    def init_from(self) -> str:
        """``real`` or ``noise``: what S_k starts from (``auto``: noise under
        DP, where real images would leak, else real images, as the paper)."""
        if self.image_init != "auto":
            return self.image_init
        return "noise" if self.dp_noise is not None else "real"

    def cost_per_iteration(
        self, class_counts: np.ndarray, batch_size: int
    ) -> np.ndarray:
        """Local-step equivalents of one matching iteration, float64 ``[m]``,
        from ``class_counts`` (int ``[m, C]``) and the local ``batch_size``; a
        client without data gets 1.0."""
        counts = np.asarray(class_counts, dtype=np.int64)
        if self.iteration_cost != "auto":
            return np.full(counts.shape[0], float(self.iteration_cost))
        out = np.ones(counts.shape[0])
        for k, row in enumerate(counts):
            real = np.minimum(row[row > 0], self.dc_batch_size).tolist()
            if real:
                out[k] = iteration_flops_ratio(real, self.ipc, batch_size)
        return out

    def upload_sizes(
        self,
        class_counts: np.ndarray,
        sample_shape: Sequence[int],
        float_bytes: int,
        label_bytes: int = 8,
    ) -> np.ndarray:
        """Bytes each client uploads, int64 ``[m]`` (:func:`upload_bytes` of
        the classes it holds; ``float_bytes``: the model dtype's size)."""
        held = (np.asarray(class_counts) > 0).sum(axis=1).astype(np.int64)
        return held * upload_bytes(1, self.ipc, sample_shape, float_bytes, label_bytes)

    # ------------------------------------------------ what it says about itself
    def check(self, facts: RunFacts) -> list[Problem]:
        """Also refuses a range of epochs (FedDM runs ``iterations``, not
        epochs) and warns when ``fixed_window`` cuts the iterations short for a
        fleet group's median device (docs/fedpns-feddm.md, "FedDM's cost")."""
        found = super().check(facts)
        if (classless := self._classless(facts)) is not None:
            found.append(Problem(classless))
        rs, n_iter = facts.round, self.iterations
        if rs.policy == "fixed_epochs" and rs.epochs_low is not None:
            found.append(
                Problem(
                    "round.epochs_low/epochs_high: FedDM runs algorithm.iterations "
                    f"({n_iter}) matching iterations per round, not epochs; "
                    "leave them out"
                )
            )
        if rs.policy == "fixed_window" and (cut := self._window_cut(facts)):
            found.append(Problem(cut, warning=True))
        return found

    def _classless(self, facts: RunFacts) -> str | None:
        """Why FedDM cannot run on this data, or None.

        FedDM synthesises ``ipc`` samples per class and matches the real and
        synthetic data's embeddings class by class, so it needs labelled
        classes (an objective such as ``quadratic`` has none) and a network
        that ends in a classifier; without this check such a run failed only
        in the first client's training, with a traceback.
        """
        info = facts.data.info(facts.num_clients)
        if info is None or info.classes != 0:  # unknown counts are let through
            return None
        return (
            f"algorithm.name {self.name!r} synthesises samples per class, but "
            f"data.dataset {facts.dataset!r} has no classes (an "
            "objective); use an algorithm that uploads model updates"
        )

    def _window_cut(self, facts: RunFacts) -> str | None:
        """The warning for the first fleet group whose median device cannot run
        every iteration inside ``round.window_s`` (at the cheapest cost a
        client can have: the auto cost counts the largest real batch)."""
        rs, n_iter = facts.round, self.iterations
        cost = float(
            iteration_flops_ratio(
                [self.dc_batch_size], self.ipc, facts.client.batch_size
            )
            if self.iteration_cost == "auto"
            else self.iteration_cost
        )
        for g in facts.fleet.groups:
            if g.speed is None:  # a trace group: its speeds are per device
                continue
            if (fits := rs.window_s * g.speed.median / cost) < n_iter:
                return (
                    f"round.window_s ({rs.window_s:g} s) cuts FedDM's matching "
                    f"short: at algorithm.iteration_cost >= {cost:.3g} local steps "
                    f"per iteration, the median device of fleet group {g.name!r} "
                    f"({g.speed.median:g} steps/s) runs at most {math.floor(fits)} "
                    f"of algorithm.iterations ({n_iter}); for all of them give "
                    f"round.window_s >= {n_iter * cost / g.speed.median:.4g}, "
                    "fewer iterations, or round.policy fixed_epochs"
                )
        return None

    def clock_work(self, facts: RunFacts, data: FederatedData) -> JobWork | None:
        """Its ``iterations`` at :meth:`cost_per_iteration` each, and the
        synthetic set's upload (images in the model's dtype, labels in the
        data's); None for data without classes (nothing to match)."""
        from fedsim.clock import JobWork
        from fedsim.data.partition import label_histogram

        if not data.num_classes:
            return None
        counts = label_histogram(data)
        return JobWork(
            steps=int(self.iterations),
            unit_cost=self.cost_per_iteration(counts, facts.client.batch_size),
            bytes_up=self.upload_sizes(
                counts,
                np.asarray(data.x).shape[1:],
                facts.elem_bytes,
                np.asarray(data.y).itemsize,
            ),
        )

    def memory(
        self, facts: RunFacts, params: int, data: DataInfo
    ) -> tuple[int, str] | None:
        """The synthetic sets the server holds: each client sends ``ipc``
        images per class it holds, at most all classes (int64 labels)."""
        if not (data.sample_bytes and data.classes):
            return None
        images = facts.num_clients * data.classes * self.ipc
        what = f"algorithm.ipc {self.ipc}: FedDM's synthetic set"
        return images * (data.sample_bytes + 8), what

    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        """The global model, the server's seed (from ``x0``, itself a function
        of the scenario seed) and the round, which with the seed picks each
        round's server minibatches."""
        seed = torch.tensor(_stable_seed(x0), dtype=torch.int64)
        return {"x": x0.clone(), "seed": seed, "round": torch.zeros_like(seed)}

    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, base.AggregateInfo]:
        """Train the global model on the union of the synthetic sets received.

        Args:
            state: ``x`` (the global model w_r), ``seed`` and ``round``.
            updates: The clients' updates; their ``extras`` carry ``images``
                and ``labels`` (an update without labels is left out).
            ctx: ``ctx.server.model``, the server's copy of the network,
                trained in place on the device its parameters are on (the
                server's device; the synthetic sets are moved there, the new
                ``x`` comes back to ``x``'s device and dtype).

        Returns:
            The state with the new ``x`` and the next ``round``, and the meter
            of the updates used, weighted by their synthetic samples. The state
            is unchanged when no synthetic sample arrived.

        Raises:
            TypeError: ``ctx.server`` is missing.
        """
        ups = [u for u in updates if "labels" in u.extras and len(u.extras["labels"])]
        if not ups:
            return state, base.empty_info()
        if ctx.server is None:
            raise TypeError(
                "FedDM trains on the server: pass RoundContext(server=ServerContext)"
            )
        x_r, model = state["x"], ctx.server.model
        params = list(model.parameters())
        dev = params[0].device  # the server's device (on the CPU: as before)
        images = torch.cat([u.extras["images"] for u in ups]).to(dev)
        labels = torch.cat([u.extras["labels"] for u in ups]).long().to(dev)
        # the network's parameters become views of a copy of w_r: the steps
        # below must not move x_r, the centre of the ball projection
        torch.nn.utils.vector_to_parameters(x_r.to(dev, copy=True), params)
        model.train()
        opt = torch.optim.SGD(
            params,
            lr=self.server_lr,
            momentum=self.server_momentum,
            weight_decay=self.server_weight_decay,
        )
        # a stream per round, so a resumed run draws the same minibatches
        ss = np.random.SeedSequence([int(state["seed"]), int(state["round"])])
        gen = torch.Generator().manual_seed(int(ss.generate_state(1)[0]))
        self._server_epochs(model, opt, images, labels, x_r.to(dev), gen)
        x_new = torch.nn.utils.parameters_to_vector(params).detach().clone()
        w = [float(len(u.extras["labels"])) for u in ups]
        tau_eff = updates_tau_eff("steps", [1.0] * len(ups), ups)
        x_new = x_new.to(x_r.device, x_r.dtype)
        new = {**state, "x": x_new, "round": state["round"] + 1}
        info = base.meter_subset(updates, base.meter(ups, w, tau_eff))
        # every server epoch trains on each synthetic sample once: the
        # server's clock bills these samples at the model's FLOPs per sample
        work = base.ServerWork(train_samples=float(self.server_epochs * len(labels)))
        return new, replace(info, server_work=work)

    def _server_epochs(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        images: torch.Tensor,
        labels: torch.Tensor,
        x_r: torch.Tensor,
        gen: torch.Generator,
    ) -> None:
        """``server_epochs`` passes of minibatch SGD over the synthetic union,
        each in an order drawn from ``gen``; with ``ball``, every step is
        projected back onto B_rho(``x_r``)."""
        params = list(model.parameters())
        n, bs = len(labels), self.server_batch_size
        for _ in range(self.server_epochs):
            for idx in torch.randperm(n, generator=gen).split(bs):
                idx = idx.to(images.device)  # drawn on the CPU: the same order
                loss = F.cross_entropy(model(images[idx]), labels[idx])
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
                if self.ball:
                    _project(params, x_r, self.rho)

    def client_train(self, job: base.LocalTraining) -> base.ClientUpdate:  # type: ignore[override]
        """Learn S_k at models around w_r: the client's update.

        Each iteration perturbs the global model (:func:`perturb`), draws up to
        ``dc_batch_size`` real samples per class and takes one momentum-SGD
        step on the synthetic samples (the DP-SGD estimate with ``dp_noise``).
        Only ``job.step_budget`` iterations run when the clock cuts the round.

        Args:
            job: The worker's model (its parameters viewing ``job.theta``),
                the client's rows, generator, weight and payload ``x``.

        Returns:
            An update with an empty ``delta`` and ``extras`` ``images`` and
            ``labels`` (``ipc`` per class held); ``tau`` is the iterations run.
        """
        model, theta, xs, ys, gen = job.model, job.theta, job.xs, job.ys, job.gen
        x_global = job.client.payload["x"]
        n_iter = self._iterations(job.step_budget)
        classes = torch.unique(ys)
        by_class = [torch.nonzero(ys == c).flatten() for c in classes.tolist()]
        syn = self._init_synthetic(xs, by_class, gen)
        labels = classes.repeat_interleave(self.ipc)
        opt = torch.optim.SGD([syn], lr=self.image_lr, momentum=self.image_momentum)
        # the model is a fixed feature map here: no parameter gradients, and
        # eval mode (running normalisation statistics, no dropout) so the
        # features do not depend on which samples share the batch
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.requires_grad_(False)
        model.eval()
        loss_sum = 0.0
        try:
            for _ in range(n_iter):
                with torch.no_grad():
                    theta.copy_(perturb(x_global, self.rho, gen))
                real = [_draw(xs, idx, self.dc_batch_size, gen) for idx in by_class]
                loss = self._syn_step(model, opt, real, syn, gen)
                loss_sum += float(loss.detach())
        finally:  # the worker's model goes on to train other clients
            model.train()
            for p in params:
                p.requires_grad_(True)
            theta.copy_(x_global)
        images = syn.detach().clone()
        return base.ClientUpdate(
            client=job.client.info.client,
            delta=x_global.new_zeros(0),
            weight=job.weight,
            tau=n_iter,
            norm_a=float(n_iter),
            train_loss=loss_sum / max(n_iter, 1),
            extras={"images": images, "labels": labels},
            bytes_up=sum(t.numel() * t.element_size() for t in (images, labels)),
        )

    def _iterations(self, budget: int | None) -> int:
        """The matching iterations a client runs: ``iterations``, or fewer when
        the clock's ``budget`` (its step budget) cuts the round short."""
        return self.iterations if budget is None else min(self.iterations, budget)

    def _syn_step(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        real: list[torch.Tensor],
        syn: torch.Tensor,
        gen: torch.Generator,
    ) -> torch.Tensor:
        """One optimiser step on the synthetic samples ``syn`` against the real
        batches ``real`` (the DP-SGD gradient with ``dp_noise``); returns L."""
        opt.zero_grad(set_to_none=False)
        if self.dp_noise is None:
            loss = matching_loss(model, real, syn.split(self.ipc))
            loss.backward()
        else:
            loss = self._dp_gradient(model, real, syn, gen)
        opt.step()
        return loss

    def _init_synthetic(
        self, xs: torch.Tensor, by_class: list[torch.Tensor], gen: torch.Generator
    ) -> torch.Tensor:
        """S_k's start, ``ipc`` samples per class in ``by_class`` order, as a
        leaf tensor to optimise (:attr:`init_from`).

        Args:
            xs: The client's samples.
            by_class: The row indices of each class the client holds.
            gen: The client's generator.
        """
        shape, parts = (self.ipc, *xs.shape[1:]), []
        for idx in by_class:
            if self.init_from == "noise":
                parts.append(torch.randn(shape, generator=gen, dtype=xs.dtype))
            elif len(idx) >= self.ipc:
                parts.append(_draw(xs, idx, self.ipc, gen))
            else:  # fewer real images than ipc: repeat some
                pick = torch.randint(len(idx), (self.ipc,), generator=gen)
                parts.append(xs[idx[pick]])
        return torch.cat(parts).clone().requires_grad_(True)

    def _dp_gradient(
        self,
        model: nn.Module,
        real: list[torch.Tensor],
        syn: torch.Tensor,
        gen: torch.Generator,
    ) -> torch.Tensor:
        """Set ``syn.grad`` to the DP-SGD estimate of dL/dS; return L.

        Each real sample's contribution to the gradient is clipped to
        ``dp_clip`` and Gaussian noise of ``dp_noise`` x ``dp_clip`` added per
        class, so a single real sample moves S_k by a bounded amount.

        Args:
            model: The network at the perturbed global model.
            real: Each class's real batch.
            syn: The synthetic samples, ``ipc`` per class in the same order.
            gen: The client's generator (the noise).
        """
        from torch.func import vjp, vmap

        def means(s_c: torch.Tensor) -> torch.Tensor:
            h, z = embed_and_logits(model, s_c)
            return torch.cat([h.mean(0), z.mean(0)])

        grads, total = [], syn.new_zeros(())
        c_clip, sigma = self.dp_clip, float(self.dp_noise or 0.0)
        for r, s in zip(real, syn.detach().split(self.ipc), strict=True):
            with torch.no_grad():
                feats = torch.cat(embed_and_logits(model, r), dim=1)  # r_j
            f, pullback = vjp(means, s)  # type: ignore[misc]  # no aux: 2 values
            diff = feats.mean(0) - f
            total = total + (diff * diff).sum()
            # dL_c/df = 2 (f - mean_j r_j) = mean_j 2 (f - r_j): each real
            # sample's share is pulled back on its own, so it can be clipped
            per = vmap(pullback)(2.0 * (f.detach() - feats))[0]  # [B, ipc, ...]
            norms = torch.linalg.vector_norm(per.flatten(1), dim=1)
            per = per * (c_clip / norms.clamp(min=c_clip)).view(-1, *[1] * s.dim())
            noise = torch.randn(s.shape, generator=gen, dtype=s.dtype)
            grads.append((per.sum(0) + sigma * c_clip * noise) / len(r))
        syn.grad = torch.cat(grads)
        return total.detach()


def _draw(
    xs: torch.Tensor, idx: torch.Tensor, k: int, gen: torch.Generator
) -> torch.Tensor:
    """Up to ``k`` distinct rows of ``xs`` among ``idx``, drawn with ``gen``."""
    return xs[idx[torch.randperm(len(idx), generator=gen)[:k]]]


def _project(params: Sequence[torch.Tensor], center: torch.Tensor, rho: float) -> None:
    """Move ``params`` back onto the ball B_rho(center)."""
    with torch.no_grad():
        d = torch.nn.utils.parameters_to_vector(params) - center
        norm = float(torch.linalg.vector_norm(d.to(torch.float64)))
        if norm > rho and math.isfinite(norm):
            torch.nn.utils.vector_to_parameters(center + d * (rho / norm), params)
