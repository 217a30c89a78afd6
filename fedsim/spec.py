"""Base class and constrained types for the typed, frozen parts of a scenario.

A plug-in's spec lives in its module; :class:`ModelSpec` lives here, not in
:mod:`fedsim.models`, so that validating a scenario does not import torch.
"""

from __future__ import annotations

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


class ModelSpec(Spec):
    """Which network to train (docs/scenarios.md, "model"; docs/datasets.md)."""

    name: Literal[
        "logreg",
        "mlp",
        "quadratic",
        "cnn",
        "cnn_m",
        "cifar_cnn",
        "vgg11",
        "resnet18",
        "convnet",
        "lstm",
    ] = "logreg"
    hidden: list[Width] = [200, 200]
    norm_groups: Width = 2
    width: Width = 128
    depth: Annotated[int, Field(ge=1, le=16)] = 3
    embed_dim: Width = 8
    lstm_hidden: Width = 256
    lstm_layers: Annotated[int, Field(ge=1, le=16)] = 2
    dtype: Literal["float32", "float64"] = "float32"
    # logreg: start from all-zero weights and bias (the FedDyn/FedDC and FedPNS
    # codes' linear models) instead of PyTorch's default uniform init
    zero_init: bool = False

    @property
    def elem_bytes(self) -> int:
        """Bytes per parameter (what a model vector costs to send or store)."""
        return 8 if self.dtype == "float64" else 4

    @property
    def used_fields(self) -> str:
        """The fields this ``name`` reads, space-separated (``fedsim validate``
        prints only these)."""
        return f"name dtype {_MODEL_FIELDS.get(self.name, '')}".strip()

    def param_count(
        self, input_shape: tuple[int, ...], num_classes: int | None
    ) -> int | None:
        """Trainable parameters of this network on samples of ``input_shape``
        (as ``Model.param_count``; formulas in :mod:`fedsim.model_size`, no
        torch). None where only the data tells (classes unknown).

        Raises:
            ValueError: the images are too small for the network.
        """
        from fedsim.model_size import builtin_params

        return builtin_params(self, input_shape, num_classes)


# The fields each network reads beyond name and dtype.
_MODEL_FIELDS = {
    "logreg": "zero_init",
    "mlp": "hidden",
    "vgg11": "norm_groups",
    "resnet18": "norm_groups",
    "convnet": "width depth",
    "lstm": "embed_dim lstm_hidden lstm_layers",
}

# The built-in networks, all described by ModelSpec (fedsim.plugins looks a
# ``model.name`` up here first); DEFAULT is a scenario's model when it names none.
MODELS: dict[str, type[ModelSpec]] = {
    str(name): ModelSpec
    for name in ModelSpec.model_fields["name"].annotation.__args__  # type: ignore[union-attr]
}
DEFAULT = "logreg"


class Model(Spec):
    """Base of a model plug-in (the scenario's ``model`` section): its fields are
    the section's keys; ``name`` is the text the scenario wrote (a registered
    name or ``module:Class``), set when the scenario is loaded.

    Subclasses implement :meth:`build` and should implement :meth:`param_count`
    (by formula, without building tensors: ``fedsim validate`` and the memory
    check use it and stay fast).
    """

    name: str = ""
    dtype: Literal["float32", "float64"] = "float32"

    @property
    def elem_bytes(self) -> int:
        """Bytes per parameter (what a model vector costs to send or store)."""
        return 8 if self.dtype == "float64" else 4

    @property
    def used_fields(self) -> str:
        """Every field: a plug-in's fields are all its own."""
        return " ".join(type(self).model_fields)

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
        """A new network for samples of ``input_shape`` and ``num_classes``
        classes (0: an objective without classes), in float32; fedsim seeds
        torch's generator before the call and converts to ``dtype`` after."""
        raise NotImplementedError

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int | None:
        """Trainable parameters :meth:`build` would make (None: unknown, the
        memory check then leaves the model out)."""
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
    never does (docs/scenarios.md, "eval")."""

    every_rounds: Annotated[int, Field(ge=1)] = 1
    batch_size: Annotated[int, Field(ge=1)] = 4096
    objective_every: Annotated[int, Field(ge=0)] = 0


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
    server_node: Literal["driver", "any"] = "driver"
    server_cpus: Annotated[float, Field(ge=0, le=1024)] = 0.0
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
