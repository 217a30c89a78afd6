"""Training FLOPs per local step: what a speed in FLOP/s divides by.

A device whose speed is declared in FLOP/s (``speed: {dist: lognormal,
median_flops_per_s: 2.0e9, sigma: 0.5}``) runs ``flops_per_s / F`` local
steps per second, F the FLOPs of one local step of the scenario's model: the
forward and backward pass of one minibatch of the scenario's batch size.
F is counted once, before training, by ``torch.utils.flop_counter`` on the
meta device (shapes only, no memory, no arithmetic), for built-in and
plug-in models alike (docs/fleets.md, "Speed in FLOP/s").

What is counted: every matrix product and convolution, 2 FLOPs per
multiply-add, forward and backward (the gradient of the weights, and of the
inputs of every layer but the first, whose input needs none);
element-wise operations, normalisation, pooling and the loss are left out,
as torch's counter does. An LSTM is counted through its decomposition into
matrix products (the meta device decomposes it; a CPU kernel would hide it).

Example:
    >>> from fedsim.models import LogReg
    >>> model_step_flops(LogReg(), (60,), 10, batch_size=20)
    48000
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedsim.fleet import Fleet
from fedsim.models import Loss, ModelError, batch_loss, build_model
from fedsim.presets import FLASH_BATCH_SIZE
from fedsim.spec import Model

if TYPE_CHECKING:
    from fedsim.data.base import FederatedData
    from fedsim.facts import RunFacts


def count_training_flops(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: Loss | None = None
) -> int:
    """FLOPs of one training step of ``model`` on the minibatch ``(x, y)``:
    :func:`fedsim.models.batch_loss` and its backward pass.

    Args:
        model: the network (on the meta device, or any other).
        x: a minibatch of inputs, on the model's device.
        y: its targets (class ids; the quadratic model's weights).
        loss: the model's own per-sample loss (``Model.loss`` of a model
            that declares one); None: cross-entropy, as in training.
    """
    # imported here: a tenth of a second that only runs in FLOP/s pay
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        batch_loss(model, x, y, loss).backward()
    return int(counter.get_total_flops())


def model_step_flops(
    spec: Model,
    sample_shape: Sequence[int],
    num_classes: int,
    batch_size: int,
    *,
    integer_inputs: bool = False,
    x0: float = 0.0,
) -> int:
    """FLOPs of one local step of ``spec``'s network at ``batch_size``.

    Counted on the meta device; a plug-in model that cannot be built there
    is counted on the CPU instead (the same count for matrix products and
    convolutions; an opaque CPU kernel, such as an LSTM's, would count 0).
    Results are cached per (model section, shape, classes, batch size).

    Args:
        spec: the scenario's model section.
        sample_shape: one sample's shape, e.g. ``(1, 28, 28)`` or ``(60,)``.
        num_classes: classes (0: an objective without classes).
        batch_size: the client minibatch size B.
        integer_inputs: samples are token ids (sequences), not floats.
        x0: the quadratic model's initial value (no effect on the count).

    Raises:
        ValueError: the model cannot be built for these samples.
    """
    # the JSON of the section is its identity (a plug-in's spec may not hash)
    section = [
        type(spec).__module__,
        type(spec).__qualname__,
        spec.model_dump(mode="json"),
    ]
    shape = tuple(int(s) for s in sample_shape)
    key = (
        json.dumps(section, sort_keys=True),
        shape,
        num_classes,
        batch_size,
        integer_inputs,
    )
    if key not in _COUNTED:
        _COUNTED[key] = _count(spec, shape, num_classes, batch_size, integer_inputs, x0)
    return _COUNTED[key]


_COUNTED: dict[tuple[object, ...], int] = {}


def _count(
    spec: Model,
    shape: tuple[int, ...],
    classes: int,
    batch: int,
    integer_inputs: bool,
    x0: float,
) -> int:
    """:func:`model_step_flops` uncached: build the network on the meta
    device and count one step on zeros; a plug-in that cannot be built from
    shapes alone is counted on the CPU (a failure there is the model's own,
    raised as it is)."""
    declared = spec.flops(shape, classes)
    if declared is not None:
        # a model that states its forward FLOPs per sample: the backward pass
        # costs about twice the forward (the gradients of the weights and of
        # the inputs, each one product per forward product), so a step of B
        # samples costs about 3 B forward passes
        return 3 * batch * _declared(spec, declared)
    loss = spec.loss if spec.own_loss else None
    for device in ("meta", "cpu"):
        try:
            with torch.device(device):
                model = build_model(spec, math.prod(shape), classes, 0, x0, shape)
                x, y = _minibatch(model, shape, classes, batch, integer_inputs)
                counted = count_training_flops(model, x, y, loss)
                break
        except (NotImplementedError, RuntimeError):
            if device == "cpu":
                raise
    if counted <= 0:
        raise ModelError(
            f"model {_name(spec)!r}: torch's FLOP counter finds no operation in a "
            "training step (its kernels are opaque to the counter, as an LSTM's "
            "are), so a speed in FLOP/s cannot be turned into steps/s; state the "
            "forward pass's FLOPs per sample in the model's flops(), or give the "
            "fleet's speeds in steps/s"
        )
    return counted


# The most FLOPs one sample's forward pass may be said to cost: far above any
# network, and small enough that a step's count and the times it divides stay
# within a float's range.
MAX_DECLARED_FLOPS = 10**30


def _declared(spec: Model, declared: object) -> int:
    """A model's own ``flops()`` result as a count, refused unless it is a
    whole number of FLOPs from 1 to :data:`MAX_DECLARED_FLOPS` (an integral
    float is taken): a 0 divided a speed by zero, a fraction floored to 0,
    and a negative count gave negative speeds that passed.

    Raises:
        ModelError: naming the model, the hook and what was expected.
    """
    value: int | None = None
    if isinstance(declared, int | np.integer) and not isinstance(declared, bool):
        value = int(declared)
    elif isinstance(declared, float | np.floating) and math.isfinite(declared):
        value = int(declared) if float(declared).is_integer() else None
    if value is None or not 1 <= value <= MAX_DECLARED_FLOPS:
        shown = repr(declared)
        if len(shown) > 40:  # 10**400 has 401 digits
            shown = f"{shown[:12]}... ({len(shown)} characters)"
        raise ModelError(
            f"model {_name(spec)!r}: flops() returned {shown}; expected the "
            "FLOPs of one sample's forward pass, a whole number from 1 to "
            f"{MAX_DECLARED_FLOPS:.0e} (or None: torch counts them)"
        )
    return value


def _name(spec: Model) -> str:
    """How messages name a model: its ``name``, else its class."""
    return str(getattr(spec, "name", None) or type(spec).__qualname__)


def _minibatch(
    model: nn.Module, shape: tuple[int, ...], classes: int, batch: int, ints: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros shaped like a minibatch of B samples and their targets, in the
    model's float type (token ids as int64)."""
    first = next(model.parameters(), None)
    dtype = torch.int64 if ints else first.dtype if first is not None else None
    x = torch.zeros(batch, *shape, dtype=dtype)
    y = torch.zeros(batch, dtype=torch.int64) if classes > 0 else torch.ones(batch)
    return x, y


def step_flops(scenario: RunFacts, data: FederatedData | None = None) -> int:
    """FLOPs of one local step of the scenario's model at its batch size.

    Args:
        scenario: the validated scenario.
        data: the run's data (exact shapes and classes); without it the
            dataset's own description is used, and the data is built only
            when that does not give the sample shape or the classes.
    """
    spec, batch = scenario.model, scenario.client.batch_size
    if data is None:
        info = scenario.data.info(scenario.num_clients)  # no tensor built
        if info is not None and info.shape is not None and info.classes is not None:
            ints = info.kind == "sequence"
            x0 = float(getattr(scenario.data, "x0", 0.0))
            return model_step_flops(
                spec, info.shape, info.classes, batch, integer_inputs=ints, x0=x0
            )
        from fedsim.data import build_data

        data = build_data(scenario.data, scenario.num_clients, scenario.seed)
    ints = not torch.is_floating_point(torch.as_tensor(data.x[:1]))
    return model_step_flops(
        spec, tuple(data.x.shape[1:]), data.num_classes, batch, integer_inputs=ints
    )


def scenario_fleet(scenario: RunFacts, data: FederatedData | None = None) -> Fleet:
    """The scenario's fleet, with the model's FLOPs per step counted (by
    :func:`step_flops`) only when some group's speed is in FLOP/s.

    Every part that builds the fleet of a scenario (the run, the links,
    the report) goes through here, so they all get the same speeds.
    """
    flops = step_flops(scenario, data) if scenario.fleet.per_flop else None
    return Fleet.from_spec(scenario.fleet, scenario.seed, step_flops=flops)


def describe(scenario: RunFacts, flops: int) -> list[str]:
    """What ``fedsim validate`` prints for a fleet with speeds in FLOP/s:
    the count, then each such group's median in FLOP/s and in steps/s.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> from fedsim.fleet import FixedSpeed
        >>> g = NS(name="phones", speed=FixedSpeed(flops_per_s=2e9))
        >>> sc = NS(client=NS(batch_size=20), fleet=NS(groups=[g]))
        >>> describe(sc, 17_584_000)[1]
        'phones: median 2e+09 FLOP/s = 113.7 local steps/s'
    """
    out = [
        f"model: {flops:,} FLOPs per local step (forward and backward, "
        f"batch {scenario.client.batch_size})"
    ]
    for g in scenario.fleet.groups:
        if g.speed is not None and g.speed.per_flop:
            median = g.speed.median_in_unit
            out.append(
                f"{g.name}: median {median:.4g} FLOP/s = {median / flops:.4g} "
                "local steps/s"
            )
    return out


# ----------------------------------------------------------------------------
# FLASH's workloads (LEAF's models as FLASH trained them on the phones), for
# the FLOP/s form of the FLASH speed presets (fedsim/presets.py): a tier's
# FLOP/s on a workload is its measured steps/s times these FLOPs per step.


class _LeafFemnistCNN(nn.Module):
    """LEAF's FEMNIST CNN: conv 5x5 32 and 64 ("same"), each with a 2x2 max
    pool, dense 3136 -> 2048 -> 62."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(7 * 7 * 64, 2048), nn.ReLU(), nn.Linear(2048, 62),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _LeafCelebaCNN(nn.Module):
    """LEAF's CelebA CNN: four [conv 3x3 32 ("same"), batch norm, 2x2 max
    pool ("same": 84 -> 42 -> 21 -> 11 -> 6), ReLU], dense 1152 -> 2."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c in (3, 32, 32, 32):
            layers += [nn.Conv2d(c, 32, 3, padding=1), nn.BatchNorm2d(32)]
            layers += [nn.MaxPool2d(2, ceil_mode=True), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Flatten(), nn.Linear(32 * 6 * 6, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _LeafLSTM(nn.Module):
    """LEAF's stacked LSTMs: an embedding, two LSTM layers of 256, a dense
    output on the last step (Shakespeare: next character) or on every step
    (Reddit: next word, logits flattened to ``[B * seq, vocab]``)."""

    def __init__(self, vocab: int, embed: int, every_step: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, 256, num_layers=2, batch_first=True)
        self.out = nn.Linear(256, vocab)
        self.every_step = every_step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embedding(x))
        return self.out(h).flatten(0, 1) if self.every_step else self.out(h[:, -1])


def flash_workload_flops(workload: str) -> int:
    """FLOPs of one training step of FLASH's ``workload`` at FLASH's batch
    size (:data:`fedsim.presets.FLASH_BATCH_SIZE`), counted as any model is.

    What :data:`fedsim.presets.FLASH_STEP_FLOPS` holds (tests/test_flops.py
    checks the table against this count).

    Raises:
        ValueError: an unknown workload.
    """
    if workload not in FLASH_BATCH_SIZE:
        raise ValueError(
            f"unknown workload {workload!r}; one of {list(FLASH_BATCH_SIZE)}"
        )
    b = FLASH_BATCH_SIZE[workload]
    with torch.device("meta"):
        model: nn.Module
        if workload == "femnist-cnn":
            model, x, y = _LeafFemnistCNN(), torch.zeros(b, 784), torch.zeros(b)
        elif workload == "celeba-cnn":
            model, x, y = _LeafCelebaCNN(), torch.zeros(b, 3, 84, 84), torch.zeros(b)
        elif workload == "reddit-lstm":  # vocabulary 10,000, 10 words a sample
            model, x = _LeafLSTM(10_000, 256, True), torch.zeros(b, 10).long()
            y = torch.zeros(b * 10)
        else:  # shakespeare-lstm: 80 characters in, the next one out
            model, x = _LeafLSTM(80, 8, False), torch.zeros(b, 80).long()
            y = torch.zeros(b)
        return count_training_flops(model, x, y.long())
