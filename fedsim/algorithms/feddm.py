"""FedDM: federated learning with distribution matching.

FedDM: Iterative Distribution Matching for Communication-Efficient Federated
Learning. Yuanhao Xiong, Ruochen Wang, Minhao Cheng, Felix Yu, Cho-Jui Hsieh.
CVPR 2023. arXiv:2207.09653.

ALGORITHMS.md section 10. Instead of a model update, each client k sends a
small synthetic dataset S_k whose loss landscape around the global model w_r
matches its real data; the server trains w_r on the union of the S_k.

Client k, round r (:meth:`FedDM.client_train`):

1. for each class c it holds, S_{k,c} starts as ``ipc`` random real images
   of class c (``image_init: real``) or standard normal noise (``noise``);
2. for ``iterations`` steps: draw w~ = w_r + eps min(1, rho / ||eps||),
   eps ~ N(0, I) over all parameters (so ||w~ - w_r|| = min(rho, ||eps||),
   i.e. rho for any real network); for each class, a real batch of
   ``dc_batch_size`` samples; the loss is

       L = sum_c ||mean h(real_c) - mean h(S_c)||^2 + ||mean z(real_c) - mean z(S_c)||^2

   with h the penultimate embedding and z the logits of w~ (see
   :func:`embed_and_logits`; real features are constants); one SGD step
   (lr ``image_lr``, momentum ``image_momentum``) on the pixels of S;
3. upload S_k and its labels: |C_k| ipc samples, which is the update's real
   size (``ClientUpdate.bytes_up``, see :func:`upload_bytes`).

Server (:meth:`FedDM.aggregate`): continue training from w_r on the union
S = U_k S_k (size sum_k |C_k| ipc) for ``server_epochs`` epochs of minibatch
SGD (batch ``server_batch_size``, lr ``server_lr``, momentum
``server_momentum``, weight decay ``server_weight_decay``), cross-entropy.
S is the only data the server reads (no held-out or test rows), so FedDM
needs no validation split.
With ``ball: true`` every step is projected back onto the ball B_rho(w_r),
the paper's constraint (the reimplementations do not enforce it).

Time and bytes on the clock (docs/fedpns-feddm.md, "FedDM's cost"): a
client's job is ``iterations`` matching iterations, not local SGD steps; the
clock (:class:`fedsim.clock.JobWork`) counts tau in iterations and charges
each ``iteration_cost`` local steps of compute
(:meth:`FedDM.cost_per_iteration`; by default its forward-pass count
relative to one minibatch step). Under ``round: fixed_epochs`` every client
runs all ``iterations`` (``epochs`` do not apply); under ``fixed_window`` it
runs as many as fit in the window, at most ``iterations`` (``max_steps``
bounds SGD steps, not these). Loading the scenario warns
(``FedDMClockWarning``) when the median device of a group cannot fit them
in the window; each client row's tau shows the iterations run. The upload
is timed and billed as the synthetic set it sends
(:meth:`FedDM.upload_sizes`), not d model floats. FedDM has no asynchronous
rule: ``round: async`` is refused.

Differential privacy (``dp_noise`` = sigma, ``dp_clip`` = C): the gradient
of L_c with respect to S_c is an average over the real batch of per-example
terms J^T 2 (f(S_c) - r_j), with r_j = (h, z)(x_j) and f(S_c) the synthetic
means. Each term is clipped to norm C, summed, Gaussian noise N(0, sigma^2
C^2) added, and the sum divided by the batch size (DP-SGD on the synthetic
set's updates, the paper's sigma in {1, 3, 5}, C = 5). No privacy
accountant is run. Initialising S from real images would publish them, so
with DP the default ``image_init: auto`` starts from noise and ``real`` is
refused.

Weighting: every (client, class) pair contributes ipc images to the server's
loss, whatever n_k: clients are effectively weighted by the number of
classes they hold; the meter reports w_k = |C_k| ipc / |S| against
p_k = n_k / n.

The client keeps no state (S is re-initialised every round). There is no
model delta: ``ClientUpdate.delta`` is empty (``update_norm`` is 0) and the
extras ``images`` and ``labels`` carry S_k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import (
    AggregateInfo,
    Algorithm,
    ClientUpdate,
    LocalTraining,
    ServerContext,
    ServerState,
    Updates,
    empty_info,
    meter_subset,
)
from fedsim.algorithms.weighting import updates_tau_eff
from fedsim.lazy import F, nn, torch
from fedsim.spec import NonNegFloat, PosFloat, PosInt

__all__ = [
    "FedDM",
    "embed_and_logits",
    "class_matching_loss",
    "matching_loss",
    "perturb",
    "synthetic_size",
    "upload_bytes",
    "iteration_flops_ratio",
]

_SERVER_TAG = 0xFEDD


# ------------------------------------------------------------------ model access
def output_layer(model: nn.Module) -> nn.Linear:
    """The model's last ``nn.Linear`` (in registration order): its input is
    the penultimate embedding h, its output the logits z."""
    last = None
    for m in model.modules():
        if isinstance(m, nn.Linear):
            last = m
    if last is None:
        raise ValueError(
            f"FedDM needs a classifier ending in an nn.Linear layer; "
            f"{type(model).__name__} has none"
        )
    return last


def embed_and_logits(
    model: nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, z): the penultimate embedding and the logits of ``model`` on ``x``.

    A model may define ``embed_and_logits(x)`` itself. Otherwise h is the
    input of the model's last ``nn.Linear`` (flattened), which must produce
    the model's output: true of every classifier in :mod:`fedsim.models`
    (for ``convnet`` h is ``model.embed(x)``, the flattened features, as in
    FedDM's code; for ``logreg`` it is the flattened input).

    Example:
        >>> m = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        >>> h, z = embed_and_logits(m, torch.zeros(5, 4))
        >>> tuple(h.shape), tuple(z.shape)
        ((5, 3), (5, 2))
    """
    own = getattr(model, "embed_and_logits", None)
    if callable(own):
        return own(x)
    head = output_layer(model)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = head.register_forward_hook(lambda mod, i, o: seen.append((i[0], o)))
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


def class_matching_loss(
    h_real: torch.Tensor,
    z_real: torch.Tensor,
    h_syn: torch.Tensor,
    z_syn: torch.Tensor,
) -> torch.Tensor:
    """L_c = ||mean h_real - mean h_syn||^2 + ||mean z_real - mean z_syn||^2."""
    dh = h_real.mean(0) - h_syn.mean(0)
    dz = z_real.mean(0) - z_syn.mean(0)
    return (dh * dh).sum() + (dz * dz).sum()


def matching_loss(
    model: nn.Module,
    real: Sequence[torch.Tensor],
    syn: Sequence[torch.Tensor],
) -> torch.Tensor:
    """sum_c L_c over classes: ``real[c]`` and ``syn[c]`` are class c's real
    batch and synthetic set. Real features are constants (no gradient).

    Example:
        >>> m = nn.Linear(3, 2)
        >>> s = [torch.randn(4, 3), torch.randn(2, 3)]
        >>> loss = matching_loss(m, s, [t.flip(0) for t in s])   # same multisets
        >>> round(float(loss.detach()), 6)
        0.0
    """
    with torch.no_grad():
        h_r, z_r = embed_and_logits(model, torch.cat(list(real)))
    h_s, z_s = embed_and_logits(model, torch.cat(list(syn)))
    total = h_s.new_zeros(())
    a = b = 0
    for r, s in zip(real, syn, strict=True):
        total = total + class_matching_loss(
            h_r[a : a + len(r)],
            z_r[a : a + len(r)],
            h_s[b : b + len(s)],
            z_s[b : b + len(s)],
        )
        a, b = a + len(r), b + len(s)
    return total


def perturb(x: torch.Tensor, rho: float, gen: torch.Generator) -> torch.Tensor:
    """w~ = x + eps min(1, rho / ||eps||), eps ~ N(0, I) (ALGORITHMS.md 10.2).

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.zeros(10_000)
    >>> round(float(torch.linalg.vector_norm(perturb(x, 5.0, g) - x)), 4)
    5.0
    """
    eps = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    norm = float(torch.linalg.vector_norm(eps.to(torch.float64)))
    scale = min(1.0, rho / norm) if norm > 0 else 0.0
    return x + scale * eps


def synthetic_size(classes_per_client: Sequence[int], ipc: int) -> int:
    """The server's synthetic dataset size: sum_k |C_k| ipc.

    >>> synthetic_size([9, 10, 8], ipc=10)
    270
    """
    return int(sum(int(c) for c in classes_per_client)) * int(ipc)


def upload_bytes(
    n_classes: int,
    ipc: int,
    sample_shape: Sequence[int],
    float_bytes: int = 4,
    label_bytes: int = 8,
) -> int:
    """Bytes client k uploads: |C_k| ipc samples of ``sample_shape`` floats
    plus |C_k| ipc (int64) labels.

    >>> upload_bytes(9, 10, (3, 32, 32)) == 90 * 3072 * 4 + 90 * 8
    True
    """
    n = int(n_classes) * int(ipc)
    return n * int(np.prod(sample_shape)) * float_bytes + n * label_bytes


def iteration_flops_ratio(
    real_per_class: Sequence[int], ipc: int, batch_size: int
) -> float:
    """One matching iteration's compute in local SGD steps of ``batch_size``.

    Counted in per-sample forward passes, with a backward pass costing two
    forwards when it also computes weight gradients and one when it does not
    (the usual 1 : 2 forward : backward rule): an SGD step is 3 B; an
    iteration is a gradient-free forward of the real batches (sum_c
    min(dc_batch_size, n_c) samples) plus a forward and an input-only
    backward of the |C| ipc synthetic images (2 |C| ipc). The perturbation
    (d Gaussian draws) is ignored: it is small next to a network's forward
    passes over hundreds of images.

    >>> iteration_flops_ratio([256] * 10, ipc=10, batch_size=64)  # (2560 + 200) / 192
    14.375
    """
    real = sum(int(r) for r in real_per_class)
    return (real + 2 * len(real_per_class) * int(ipc)) / (3 * int(batch_size))


def _stable_seed(x: torch.Tensor) -> int:
    """A seed from the initial parameters (themselves drawn from the scenario
    seed), so the server's shuffling is a pure function of the scenario."""
    raw = x.detach().to(torch.float64).reshape(-1)[:64].numpy().tobytes()
    words = np.frombuffer(raw.ljust(8 * ((len(raw) + 7) // 8), b"\0"), np.uint32)
    ss = np.random.SeedSequence([_SERVER_TAG, *words.tolist()])
    return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


# -------------------------------------------------------------------- algorithm
@dataclass(frozen=True)
class FedDM(Algorithm):
    """Clients send per-class synthetic sets; the server trains on their union.

    Attributes (ALGORITHMS.md 10.2 defaults):
        ipc: synthetic images per class (10).
        rho: radius of the perturbation around w_r (5).
        image_lr, image_momentum: SGD on the synthetic pixels (1, 0.5).
        iterations: matching iterations per round (1000).
        dc_batch_size: real samples per class and iteration (256).
        image_init: S starts as ``real`` images, ``noise``, or ``auto``
            (real, noise with DP).
        server_epochs, server_batch_size: server training (500, 256).
        server_lr, server_momentum, server_weight_decay: its SGD
            (0.01, 0.9, 0).
        ball: project every server step onto B_rho(w_r).
        dp_noise: DP-SGD noise multiplier sigma (None: no DP).
        dp_clip: DP-SGD per-example clipping bound C (5).
        iteration_cost: local SGD steps' worth of compute one matching
            iteration takes on the clock; ``auto`` (default) counts it per
            client from its data with :func:`iteration_flops_ratio` (about
            14 steps of batch 64 for a client holding 10 classes at the
            defaults: an iteration pushes ~2,700 images through the network
            where a step pushes 64 through it and back). A number sets it
            for every client (1.0: an iteration costs one step).

    Example:
        >>> alg = FedDM(ipc=2, iterations=3)
        >>> sorted(alg.init(torch.zeros(4), num_clients=3))
        ['round', 'seed', 'x']
    """

    name: Literal["feddm"] = "feddm"
    ipc: PosInt = 10
    rho: PosFloat = 5.0
    image_lr: PosFloat = 1.0
    image_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.5
    iterations: PosInt = 1000
    dc_batch_size: PosInt = 256
    image_init: Literal["auto", "real", "noise"] = "auto"
    server_epochs: PosInt = 500
    server_batch_size: PosInt = 256
    server_lr: PosFloat = 0.01
    server_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    server_weight_decay: NonNegFloat = 0.0
    ball: bool = False
    dp_noise: NonNegFloat | None = None
    dp_clip: PosFloat = 5.0
    iteration_cost: PosFloat | Literal["auto"] = "auto"

    needs_server: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.dp_noise is not None and self.image_init == "real":
            raise ValueError(
                "image_init 'real' publishes real images, which DP (dp_noise) is "
                "meant to protect; use image_init 'noise' (or 'auto')"
            )

    @property
    def init_from(self) -> str:
        if self.image_init != "auto":
            return self.image_init
        return "noise" if self.dp_noise is not None else "real"

    # ------------------------------------------------------------ clock
    def cost_per_iteration(
        self, class_counts: np.ndarray, batch_size: int
    ) -> np.ndarray:
        """Local-step equivalents of one matching iteration, per client.

        Args:
            class_counts: int ``[m, C]``, client k's samples of class c.
            batch_size: B of a local SGD step (``client.batch_size``).

        Returns:
            float64 ``[m]``: ``iteration_cost``, or with ``auto``
            :func:`iteration_flops_ratio` of the client's real batches
            (min(dc_batch_size, n_kc) per class held); a client without data
            gets 1.0 (it never trains).
        """
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
        """Bytes each client uploads (:func:`upload_bytes` of the classes it
        holds), int64 ``[m]``: ``float_bytes`` is the element size of the
        images as sent (the model's dtype, which the worker casts data to)
        and ``label_bytes`` that of the labels (int64)."""
        held = (np.asarray(class_counts) > 0).sum(axis=1)
        return np.array(
            [
                upload_bytes(c, self.ipc, sample_shape, float_bytes, label_bytes)
                for c in held.tolist()
            ],
            dtype=np.int64,
        )

    # ------------------------------------------------------------ server
    def init(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        return {
            "x": x0.clone(),
            "seed": torch.tensor(_stable_seed(x0), dtype=torch.int64),
            "round": torch.tensor(0, dtype=torch.int64),
        }

    def aggregate(
        self,
        state: ServerState,
        updates: Updates,
        *,
        server: ServerContext | None = None,
    ) -> tuple[ServerState, AggregateInfo]:
        ups = [u for u in updates if "labels" in u.extras and len(u.extras["labels"])]
        if not ups:
            return state, empty_info()
        if server is None:
            raise TypeError("FedDM trains on the server: pass server=ServerContext")
        images = torch.cat([u.extras["images"] for u in ups])
        labels = torch.cat([u.extras["labels"] for u in ups]).long()
        x_r = state["x"]
        model = server.model
        server.load(x_r.clone())  # the model's parameters become views of the copy
        model.train()
        params = list(model.parameters())
        opt = torch.optim.SGD(
            params,
            lr=self.server_lr,
            momentum=self.server_momentum,
            weight_decay=self.server_weight_decay,
        )
        ss = np.random.SeedSequence([int(state["seed"]), int(state["round"])])
        gen = torch.Generator().manual_seed(int(ss.generate_state(1)[0]))
        n, bs = len(labels), self.server_batch_size
        for _ in range(self.server_epochs):
            perm = torch.randperm(n, generator=gen)
            for start in range(0, n, bs):
                idx = perm[start : start + bs]
                loss = F.cross_entropy(model(images[idx]), labels[idx])
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
                if self.ball:
                    _project(params, x_r, self.rho)
        with torch.no_grad():
            x_new = torch.nn.utils.parameters_to_vector(params).detach().clone()
        w = [float(len(u.extras["labels"])) for u in ups]
        tau_eff = updates_tau_eff("steps", [1.0] * len(ups), ups)
        new = {**state, "x": x_new.to(x_r.dtype), "round": state["round"] + 1}
        return new, meter_subset(updates, ups, w, tau_eff)

    # ------------------------------------------------------------ client
    def client_train(self, job: LocalTraining) -> ClientUpdate:  # type: ignore[override]
        """Learn S_k at models around w_r (steps 1-3 of the module docstring)."""
        model, theta, xs, ys, gen = job.model, job.theta, job.xs, job.ys, job.gen
        x_global = job.client.payload["x"]
        n_iter = self.iterations
        if job.step_budget is not None:
            n_iter = min(n_iter, int(job.step_budget))
        classes = torch.unique(ys)
        by_class = [torch.nonzero(ys == c).flatten() for c in classes.tolist()]
        syn = self._init_synthetic(xs, by_class, gen)
        labels = classes.repeat_interleave(self.ipc)
        opt = torch.optim.SGD([syn], lr=self.image_lr, momentum=self.image_momentum)
        params = list(model.parameters())
        was = [p.requires_grad for p in params]
        for p in params:
            p.requires_grad_(False)
        model.eval()
        loss_sum = 0.0
        try:
            for _ in range(n_iter):
                with torch.no_grad():
                    theta.copy_(perturb(x_global, self.rho, gen))
                real = [
                    xs[
                        idx[
                            torch.randperm(len(idx), generator=gen)[
                                : self.dc_batch_size
                            ]
                        ]
                    ]
                    for idx in by_class
                ]
                opt.zero_grad(set_to_none=False)
                if self.dp_noise is None:
                    loss = matching_loss(model, real, syn.split(self.ipc))
                    loss.backward()
                else:
                    loss = self._dp_gradient(model, real, syn, gen)
                opt.step()
                loss_sum += float(loss.detach())
        finally:
            model.train()
            for p, r in zip(params, was, strict=True):
                p.requires_grad_(r)
            theta.copy_(x_global)
        images = syn.detach().clone()
        return ClientUpdate(
            client=job.client.info.client,
            delta=x_global.new_zeros(0),
            weight=job.weight,
            tau=n_iter,
            norm_a=float(n_iter),
            train_loss=loss_sum / max(n_iter, 1),
            extras={"images": images, "labels": labels},
            bytes_up=images.numel() * images.element_size()
            + labels.numel() * labels.element_size(),
        )

    def _init_synthetic(
        self, xs: torch.Tensor, by_class: list[torch.Tensor], gen: torch.Generator
    ) -> torch.Tensor:
        parts = []
        for idx in by_class:
            if self.init_from == "noise":
                parts.append(
                    torch.randn(
                        (self.ipc, *xs.shape[1:]), generator=gen, dtype=xs.dtype
                    )
                )
            elif len(idx) >= self.ipc:
                parts.append(
                    xs[idx[torch.randperm(len(idx), generator=gen)[: self.ipc]]]
                )
            else:  # fewer real images than ipc: repeat some
                parts.append(
                    xs[idx[torch.randint(len(idx), (self.ipc,), generator=gen)]]
                )
        return torch.cat(parts).clone().requires_grad_(True)

    def _dp_gradient(
        self,
        model: nn.Module,
        real: list[torch.Tensor],
        syn: torch.Tensor,
        gen: torch.Generator,
    ) -> torch.Tensor:
        """Set ``syn.grad`` to the DP-SGD estimate of dL/dS; return L."""
        from torch.func import vjp, vmap

        grads, total = [], syn.new_zeros(())
        c_clip, sigma = self.dp_clip, float(self.dp_noise or 0.0)
        for r, s in zip(real, syn.detach().split(self.ipc), strict=True):
            with torch.no_grad():
                h_r, z_r = embed_and_logits(model, r)
                feats = torch.cat([h_r, z_r], dim=1)  # r_j

            def means(s_c: torch.Tensor) -> torch.Tensor:
                h, z = embed_and_logits(model, s_c)
                return torch.cat([h.mean(0), z.mean(0)])

            f, pullback = vjp(means, s)  # type: ignore[misc]  # no aux: 2 values
            diff = feats.mean(0) - f
            total = total + (diff * diff).sum()
            per = vmap(pullback)(2.0 * (f.detach() - feats))[0]  # [B, ipc, ...]
            norms = torch.linalg.vector_norm(per.flatten(1), dim=1)
            per = per * (c_clip / torch.clamp(norms, min=c_clip)).view(
                -1, *[1] * (per.dim() - 1)
            )
            noise = torch.randn(s.shape, generator=gen, dtype=s.dtype)
            grads.append((per.sum(0) + sigma * c_clip * noise) / len(r))
        syn.grad = torch.cat(grads)
        return total.detach()


def _project(params: Sequence[torch.Tensor], center: torch.Tensor, rho: float) -> None:
    """Move ``params`` back onto the ball of radius ``rho`` around ``center``."""
    with torch.no_grad():
        x = torch.nn.utils.parameters_to_vector(params)
        d = x - center
        norm = float(torch.linalg.vector_norm(d.to(torch.float64)))
        if norm > rho and math.isfinite(norm):
            torch.nn.utils.vector_to_parameters(center + d * (rho / norm), params)
