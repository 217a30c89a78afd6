"""Base class and constrained types for the typed, frozen parts of a scenario,
and the sections that are neither plug-ins nor the clock's or the fleet's:
local training, evaluation, checkpoints, resources, and the base of a model.

Nothing here imports torch: validating a scenario must not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from fedsim.lazy import torch


class Spec(BaseModel):
    """Frozen, rejects unknown keys and non-finite numbers: the base of every
    pydantic section of a scenario (a model or dataset plug-in's too), so a
    misspelt key is an error, not a silently ignored setting."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# For plug-ins written as frozen dataclasses (algorithms, selectors).
PLUGIN_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Prob = Annotated[float, Field(ge=0, le=1)]
PosInt = Annotated[int, Field(ge=1)]

Width = Annotated[int, Field(ge=1, le=65536)]


@dataclass(frozen=True)
class DataInfo:
    """What a dataset's spec says about its samples: ``kind`` ``vector``, ``image``
    ([C, H, W]) or ``sequence``; ``samples`` (train + test) estimated; ``classes``
    0 for an objective without classes; None where only the data tells."""

    kind: str
    shape: tuple[int, ...] | None
    classes: int | None
    samples: int | None

    @property
    def sample_bytes(self) -> int | None:
        """float32 bytes of one sample's inputs."""
        return None if self.shape is None else 4 * math.prod(self.shape)


class Model(Spec):
    """Base of a model (the scenario's ``model`` section), a plug-in's or a
    built-in's (:mod:`fedsim.models`): its fields are the section's keys;
    ``name`` is the text the scenario wrote (a registered name or
    ``module:Class``), set when the scenario is loaded.

    Subclasses implement :meth:`build` and should implement
    :meth:`param_count` (by formula, without building tensors: ``fedsim
    validate`` and the memory check use it and stay fast). What else a model
    may state about itself, each with a default that asks nothing:
    :meth:`data_problem` (samples it cannot read, refused before a run),
    :meth:`loss` (its own per-sample loss instead of cross-entropy) and
    :meth:`flops` (its forward pass's cost). Import torch inside the
    methods, never at the top of the module.
    """

    name: str = ""
    dtype: Literal["float32", "float64"] = "float32"

    @property
    def elem_bytes(self) -> int:
        """Bytes per parameter (what a model vector costs to send or store)."""
        return 8 if self.dtype == "float64" else 4

    @property
    def used_fields(self) -> str:
        """Every field, space-separated: a model's fields are all its own
        (``fedsim validate`` prints these)."""
        return " ".join(type(self).model_fields)

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
        """A new network.

        Args:
            input_shape: one sample's shape (e.g. (1, 28, 28), or (60,)).
            num_classes: the classes (0: an objective without classes; a
                sequence model: its vocabulary).

        Returns:
            The network, in float32: fedsim seeds torch's generator before
            the call (so the weights are a pure function of the run's seed)
            and converts to ``dtype`` after.

        Raises:
            ValueError: samples the network cannot read.
        """
        raise NotImplementedError

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int | None:
        """Trainable parameters :meth:`build` would make, by formula.

        Args:
            input_shape: one sample's shape, as the dataset states it.
            num_classes: the classes.

        Returns:
            The count, or None: unknown (the memory check then leaves the
            model out).
        """
        return None

    def data_problem(self, info: DataInfo) -> str | None:
        """Why this network cannot read the samples ``info`` describes,
        asked before any data is built (``fedsim validate``, ``fedsim run``).

        Args:
            info: what the dataset states of its samples (kind, shape,
                classes; None where it cannot tell).

        Returns:
            The reason, worded to follow "model.name ... does not fit
            data.dataset ...: "; None: it can (or ``info`` cannot tell).
        """
        return None

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of each sample of a batch, which local training
        minimises (its mean) and evaluation reports.

        The default, cross-entropy of class logits (a sequence: the mean over
        its positions), is what fedsim computes when a model does not
        override this (by its own fused path, so the floats stay those of
        every run before the hook existed); overriding it declares the
        model's own loss (:attr:`own_loss`), e.g. the quadratic objectives'
        h ||x - e||^2 / 2.

        Args:
            outputs: the network's outputs on a batch, ``[B, ...]``.
            targets: the batch's targets, ``[B]``.

        Returns:
            Per-sample losses, ``[B]``, differentiable in the outputs.
        """
        from fedsim.lazy import F

        per = F.cross_entropy(outputs, targets, reduction="none")
        return per.reshape(len(outputs), -1).mean(dim=1)

    @property
    def own_loss(self) -> bool:
        """Whether the class declares its own :meth:`loss`."""
        return type(self).loss is not Model.loss

    def flops(self, input_shape: tuple[int, ...], num_classes: int) -> int | None:
        """Floating-point operations of one sample's forward pass, when the
        model states them itself; None (the default): ``fedsim.flops``
        counts a training step of the built network with torch's counter.
        A stated count is charged 3 x batch size per local step (the
        backward pass costs about twice the forward), which is what a speed
        in FLOP/s divides (docs/fleets.md).

        Args:
            input_shape: one sample's shape.
            num_classes: the classes.
        """
        return None


class ClientSpec(Spec):
    """Local training; ``solver`` is the local optimizer (docs/algorithms.md 5.2)."""

    solver: Literal["sgd", "momentum", "prox", "decay"] = "sgd"
    lr: PosFloat = 0.01
    batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 20
    momentum: float = Field(0.9, ge=0, lt=1)
    mu: NonNegFloat = 0.0
    step_decay: float = Field(1.0, gt=0, le=1)
    # lr_t = max(lr * lr_decay^t, lr_min), t the round (async: the job index)
    lr_decay: float = Field(1.0, gt=0, le=1)
    lr_min: NonNegFloat = 0.0
    weight_decay: NonNegFloat = 0.0
    # clip each minibatch gradient's global L2 norm to this before the step
    # (FedDC's and FedDyn's codes: 10); None: no clipping
    clip_norm: PosFloat | None = None
    # lr x0.1 from round f * rounds on, for each fraction f (FedNova's CIFAR
    # protocol: [0.5, 0.75]); empty: no steps
    lr_steps: list[Annotated[float, Field(gt=0, lt=1)]] = []

    @model_validator(mode="after")
    def _prox_needs_mu(self) -> ClientSpec:
        if self.solver == "prox" and self.mu == 0:
            raise ValueError("solver 'prox' needs mu > 0 (mu = 0 is plain sgd)")
        return self


class EvalSpec(Spec):
    """The server's evaluation: every ``every_rounds`` rounds, in batches of
    ``batch_size`` samples. ``objective_every`` k > 0 also computes the
    global training objective F(x) = sum_i p_i F_i(x) every k rounds and
    after the last (rounds.parquet's ``train_objective``); 0, the default,
    never does. ``federated_every`` k > 0 has the clients evaluate the
    global model on their own held-out rows (``data.client_test_fraction``)
    every k rounds and after the last, ``federated_clients`` of them (None:
    all), aggregated by ``Algorithm.aggregate_evaluation`` into the
    ``fed_<name>`` columns (docs/scenarios.md, "eval")."""

    every_rounds: Annotated[int, Field(ge=1)] = 1
    batch_size: Annotated[int, Field(ge=1)] = 4096
    objective_every: Annotated[int, Field(ge=0)] = 0
    # federated evaluation (fedsim.data.heldout): the clients evaluate the
    # global model on their own held-out rows every k rounds and after the
    # last (0: never); federated_clients: how many of them, drawn per round
    # (None: every client with held-out rows)
    federated_every: Annotated[int, Field(ge=0)] = 0
    federated_clients: Annotated[int, Field(ge=1)] | None = None


class CheckpointSpec(Spec):
    """A checkpoint every ``every_rounds`` rounds (0: never) and at the end."""

    every_rounds: Annotated[int, Field(ge=0)] = 10


class ServerHomeSpec(Spec):
    """Where the server runs (docs/architecture.md, "Where the server runs").

    ``driver`` (the default): in the driver process. ``actor``: a Ray actor
    with ``cpus``, ``gpus`` and custom node ``resources`` of its own, placed
    like the workers (in their placement group when there is one).
    """

    home: Literal["driver", "actor"] = "driver"
    cpus: Annotated[float, Field(ge=0, le=1024)] = 1.0
    gpus: Annotated[float, Field(ge=0, le=64)] = 0.0
    resources: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _driver_takes_nothing(self) -> ServerHomeSpec:
        # the driver is placed by whoever starts it, not by the scenario
        asked = self.gpus or self.resources
        if self.home == "driver" and asked:
            raise ValueError(
                "gpus and resources place a server actor: set home: actor, or "
                "place the driver with ray job submit --entrypoint-resources "
                "(cluster/README.md)"
            )
        return self


class ResourceSpec(Spec):
    """Ray resources (docs/scenarios.md, "Top level")."""

    workers: Literal["auto"] | Annotated[int, Field(ge=0, le=4096)] = "auto"
    cpus_per_worker: Annotated[float, Field(gt=0, le=1024)] = 1.0
    gpus_per_worker: Annotated[float, Field(ge=0, le=64)] = 0.0
    vectorize: bool = False  # equal to sequential within float tolerance only
    server: ServerHomeSpec = ServerHomeSpec()
    # gone (refused when set otherwise, below); read so that an older file
    # at the defaults loads, never written: the resolved scenario that
    # `validate` prints and run folders keep shows only live fields
    server_node: Annotated[Literal["driver", "any"], Field(exclude=True)] = "driver"
    server_cpus: Annotated[float, Field(ge=0, le=1024, exclude=True)] = 0.0
    placement: Literal["spread", "pack", "strict_spread", "strict_pack"] = "spread"
    placement_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    data: Literal["object_store", "per_node"] = "object_store"

    @model_validator(mode="after")
    def _old_server_fields(self) -> ResourceSpec:
        # refused rather than mapped: the old fields meant another placement
        how = (
            "use resources.server instead: {home: driver} (the default) or "
            "{home: actor, cpus: 1, gpus: 0, resources: {node_b: 0.01}}; the "
            "driver itself is placed with ray job submit --entrypoint-resources "
            "(cluster/README.md)"
        )
        if self.server_node != "driver":
            raise ValueError(f"server_node {self.server_node!r} is gone: {how}")
        if self.server_cpus:
            raise ValueError(f"server_cpus {self.server_cpus:g} is gone: {how}")
        return self


class ScenarioWarning(UserWarning):
    """A plug-in's warning about a valid scenario (e.g. the round window cuts
    its client work short); ``fedsim`` prints it as one ``warning:`` line."""


@dataclass(frozen=True)
class Problem:
    """What a plug-in's ``check`` found: ``message`` leads with the field path
    it is about (``round.window_s ...``); a ``warning`` lets the run go on."""

    message: str
    warning: bool = False
