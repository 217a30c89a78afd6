"""fedsim's built-in networks, each a :class:`~fedsim.spec.Model` plug-in as a
user's model is, and the helpers that build and evaluate any model.

Every built-in is one class here: its fields are the scenario's ``model``
section, and it states its own facts, as a plug-in does (docs/extending.md):
``build`` (the torch network, from :mod:`fedsim.layers`), ``param_count``
(by formula, :mod:`fedsim.model_size`: ``fedsim validate`` and the memory
check never import torch), ``data_problem`` (which samples it cannot read:
what the checks before a run ask) and, for the quadratic objectives, its own
``loss``. Nothing else in fedsim knows a network by name, so adding one is a
class here (and its line in :data:`MODELS`) plus its test; the registry is
what ``model.name`` looks up first (:mod:`fedsim.plugins`). None uses
dropout or batch norm (GroupNorm instead): training depends only on client
data and the generator. docs/datasets.md, "Models", lists them.

Example:
    >>> m = build_model(LogReg(), input_dim=60, num_classes=10, seed=0)
    >>> sum(p.numel() for p in m.parameters())
    610
    >>> CNN().param_count((1, 28, 28), 10)      # as in the FedAvg paper
    1663370
    >>> LSTM().data_problem(DataInfo("image", (1, 28, 28), 10, None))[:34]
    'lstm reads sequences of character '
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim import model_size as size
from fedsim.data.base import DataInfo, FederatedData, as_tensor
from fedsim.errors import LoadError
from fedsim.lazy import F, torch
from fedsim.spec import Model, Width

if TYPE_CHECKING:
    from torch import nn

_MODEL_INIT_TAG = 0x1A17

# A per-sample loss: (outputs [B, ...], targets [B]) -> losses [B].
Loss = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


class BuiltinModel(Model):
    """What fedsim's own networks share: ``name`` is their registry name, and
    each reads only its own fields (another built-in network's field is
    refused in one line that says whose it is)."""

    @model_validator(mode="before")
    @classmethod
    def _others_fields(cls, data: object) -> object:
        """Refuse a field of other built-in networks only, naming them (a
        section written when one spec held every network's fields)."""
        if not isinstance(data, dict):
            return data
        for key in data:
            owners = [n for n, c in MODELS.items() if key in c.model_fields]
            if key not in cls.model_fields and owners:
                mine = ", ".join(k for k in cls.model_fields if k != "name")
                raise ValueError(
                    f"{key} is a field of {', '.join(owners)}, not of "
                    f"{cls.model_fields['name'].default}: each network reads "
                    f"only its own ({mine}); drop it"
                )
        return data


class _Classifier(BuiltinModel):
    """A network that classifies: it needs labelled data."""

    def data_problem(self, info: DataInfo) -> str | None:
        """Refuses data without classes (an objective)."""
        if info.classes == 0:
            return (
                f"{self.name} classifies, and these samples have no classes "
                "(an objective: model.name quadratic reads it)"
            )
        return None

    def _classes(self, num_classes: int) -> None:
        """Refuse to build without classes (a scenario that skipped the
        checks before a run)."""
        if num_classes < 1:
            raise ValueError(f"model {self.name!r} needs a dataset with classes")


class LogReg(_Classifier):
    """Multinomial logistic regression: one linear layer on the flattened
    sample. ``zero_init`` starts from all-zero weights and bias (the
    FedDyn/FedDC and FedPNS codes' linear models) instead of PyTorch's
    default uniform initialisation."""

    name: Literal["logreg"] = "logreg"
    zero_init: bool = False

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """Flatten, then Linear(d, classes)."""
        from fedsim import layers

        self._classes(num_classes)
        d = math.prod(input_shape)
        net = torch.nn.Sequential(torch.nn.Flatten(), *layers.dense(d, [], num_classes))
        if self.zero_init:
            with torch.no_grad():
                for p in net.parameters():
                    p.zero_()
        return net

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int:
        """d classes + classes."""
        return size.dense_params(math.prod(input_shape), [], num_classes)


class MLP(_Classifier):
    """Dense layers with ReLUs on the flattened sample, ``hidden`` wide
    (784-200-200-10 is FedDC's MNIST MLP)."""

    name: Literal["mlp"] = "mlp"
    hidden: list[Width] = [200, 200]

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """Flatten, then Linear/ReLU through ``hidden`` to the classes."""
        from fedsim import layers

        self._classes(num_classes)
        d = math.prod(input_shape)
        dense = layers.dense(d, self.hidden, num_classes)
        return torch.nn.Sequential(torch.nn.Flatten(), *dense)

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int:
        """Each layer's weights and biases."""
        return size.dense_params(math.prod(input_shape), self.hidden, num_classes)


class Quadratic(BuiltinModel):
    """The FedNova paper's quadratic objectives' model (docs/algorithms.md
    section 6): the point x itself, one parameter per coordinate, and its
    own loss h/2 ||x - e||^2 per sample (centre e, curvature h). It reads the
    quadratic objectives only (data without classes)."""

    name: Literal["quadratic"] = "quadratic"

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """x, all zeros (the data's ``start_value`` x_0 is set by fedsim)."""
        from fedsim import layers

        return layers.QuadraticModel(math.prod(input_shape))

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int:
        """One per coordinate of a centre."""
        return math.prod(input_shape)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """h ||x - e||^2 / 2: the curvatures (the targets) times the network's
        half squared distances (its outputs)."""
        return targets * outputs

    def data_problem(self, info: DataInfo) -> str | None:
        """Refuses data with classes."""
        if info.classes:
            return (
                "quadratic is the quadratic objectives' model; these samples "
                "have classes (use data.dataset quadratic, or a classifier)"
            )
        return None


class _ImageModel(_Classifier):
    """A network on [C, H, W] images (a square vector reads as one grey
    channel); subclasses give its trunk and head (:meth:`_trunk`) and the
    smallest image side it can shrink (:meth:`min_side`)."""

    # the classifier's hidden widths after the trunk
    head_widths: ClassVar[tuple[int, ...]] = ()

    def min_side(self, channels: int) -> int:
        """The smallest image side the trunk leaves non-empty."""
        return 1

    def _trunk(self, channels: int) -> list[size.Layer]:
        """The trunk's convolutions and poolings (for the count)."""
        raise NotImplementedError

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int | None:
        """By formula over :meth:`_trunk`; None for samples that are no image.

        Raises:
            ValueError: the images are too small for the network.
        """
        image = size.as_image(input_shape)
        if image is None:
            return None
        trunk = self._trunk(image[0])
        return size.image_params(self.name, trunk, self.head_widths, image, num_classes)

    def data_problem(self, info: DataInfo) -> str | None:
        """Refuses sequences, vectors that are no square image, and images
        smaller than :meth:`min_side`."""
        if (classless := super().data_problem(info)) is not None:
            return classless
        if info.kind == "sequence":
            return f"{self.name} needs images, not character sequences"
        if info.shape is None:
            return None  # a tabular file not at hand: building the data will tell
        image = size.as_image(info.shape) if info.kind != "image" else info.shape
        if image is None or len(image) != 3:
            return (
                f"{self.name} needs images [C, H, W] or a square number of "
                f"features, the samples have shape {info.shape}; use logreg or mlp"
            )
        low = self.min_side(image[0])
        if min(image[1:]) < low:
            return (
                f"{self.name} needs images of at least {low}x{low}, the "
                f"samples are {image[1]}x{image[2]}"
            )
        return None


class _PooledCNN(_ImageModel):
    """5x5 convolutions of ``conv_widths`` channels (``conv_padding`` on each
    side), each with ReLU and 2x2 max-pooling (:func:`fedsim.layers.conv_pool`),
    then a dense head of ``head_widths``: the papers' small CNNs."""

    conv_widths: ClassVar[tuple[int, ...]] = ()
    conv_padding: ClassVar[int] = 0

    def min_side(self, channels: int) -> int:
        """Backwards from a 1x1 output: each pooling needs twice the side, each
        convolution 4 more less twice its padding (4 for two padded blocks,
        16 for two unpadded ones)."""
        side = 1
        for _ in self.conv_widths:
            side = 2 * side + 4 - 2 * self.conv_padding
        return side

    def _trunk(self, channels: int) -> list[size.Layer]:
        convs = [(w, 5, self.conv_padding, False) for w in self.conv_widths]
        return [layer for conv in convs for layer in (conv, size.POOL)]

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """The network; ValueError for samples that are no image."""
        from fedsim import layers

        self._classes(num_classes)
        s = size.image_of(input_shape, self.name)
        trunk = layers.conv_pool(s[0], self.conv_widths, padding=self.conv_padding)
        return layers.ImageNet(s, trunk, layers.head(self.head_widths, num_classes))


class CNN(_PooledCNN):
    """McMahan et al. 2017, section 3: two 5x5 convolutions (32, 64) with 2x2
    max-pooling, a 512-unit dense layer; 1,663,370 parameters on 28x28x1."""

    name: Literal["cnn"] = "cnn"
    conv_widths: ClassVar[tuple[int, ...]] = (32, 64)
    conv_padding: ClassVar[int] = 2
    head_widths: ClassVar[tuple[int, ...]] = (512,)


class CNNM(_PooledCNN):
    """FedPNS's CNN-M (docs/algorithms.md 14, FedPNS): conv(10, 5x5),
    conv(20, 5x5), each with 2x2 max-pooling, FC 320 -> 50 -> classes, no
    dropout; 21,840 parameters on 28x28x1."""

    name: Literal["cnn_m"] = "cnn_m"
    conv_widths: ClassVar[tuple[int, ...]] = (10, 20)
    head_widths: ClassVar[tuple[int, ...]] = (50,)


class CifarCNN(_PooledCNN):
    """The FedDC/FedDyn code's CIFAR CNN (docs/algorithms.md 9.3): two
    unpadded 5x5 convolutions of 64, pooled, then 384 and 192 dense units."""

    name: Literal["cifar_cnn"] = "cifar_cnn"
    conv_widths: ClassVar[tuple[int, ...]] = (64, 64)
    head_widths: ClassVar[tuple[int, ...]] = (384, 192)


# configuration A: channels of each 3x3 convolution, with its poolings
_VGG11: tuple[int | str, ...] = (64, size.POOL, 128, size.POOL, 256, 256, size.POOL)
_VGG11 += (512, 512, size.POOL, 512, 512, size.POOL)


class VGG11(_ImageModel):
    """torchvision's VGG-11 (configuration A) with GroupNorm in place of
    batch norm (``norm_groups``) and FedNova's classifier without dropout."""

    name: Literal["vgg11"] = "vgg11"
    norm_groups: Width = 2
    head_widths: ClassVar[tuple[int, ...]] = (512, 512)

    def min_side(self, channels: int) -> int:
        """Five poolings: 32."""
        return 32

    def _trunk(self, channels: int) -> list[size.Layer]:
        return [v if v == size.POOL else (int(v), 3, 1, True) for v in _VGG11]

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """The network; ValueError for images smaller than 32x32."""
        from torchvision.models.vgg import cfgs, make_layers

        from fedsim import layers

        self._classes(num_classes)
        s = size.image_of(input_shape, "vgg11")
        if min(s[1:]) < 32:
            raise ValueError(
                f"vgg11 halves the image 5 times; it needs >= 32x32, got {s}"
            )
        nn = torch.nn
        trunk = [  # make_layers is flat: [conv, BatchNorm2d, ReLU, (maxpool)]
            layers.group_norm(self.norm_groups, m.num_features)
            if isinstance(m, nn.BatchNorm2d)
            else m
            for m in make_layers(cfgs["A"], batch_norm=True)
        ]
        if s[0] != 3:
            trunk[0] = nn.Conv2d(s[0], cfgs["A"][0], 3, padding=1)
        head = layers.head([512, 512], num_classes)
        return layers.ImageNet(s, nn.Sequential(*trunk), head)


class ResNet18(_ImageModel):
    """torchvision's ResNet-18 with GroupNorm (``norm_groups``); the CIFAR
    stem (a 3x3 convolution, no max-pooling) for images up to 32x32."""

    name: Literal["resnet18"] = "resnet18"
    norm_groups: Width = 2

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int | None:
        """torchvision's layers, counted (:func:`model_size.resnet18_params`)."""
        image = size.as_image(input_shape)
        if image is None:
            return None
        return size.resnet18_params(image[0], max(image[1:]) <= 32, num_classes)

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """The network; ValueError for samples that are no image."""
        from functools import partial

        from torchvision.models import resnet18

        from fedsim import layers

        self._classes(num_classes)
        nn = torch.nn
        s = size.image_of(input_shape, "resnet18")
        norm = partial(layers.group_norm, self.norm_groups)
        net = resnet18(weights=None, num_classes=num_classes, norm_layer=norm)
        small = max(s[1:]) <= 32
        if small or s[0] != 3:
            k, stride, pad = (3, 1, 1) if small else (7, 2, 3)
            net.conv1 = nn.Conv2d(s[0], 64, k, stride, pad, bias=False)
            nn.init.kaiming_normal_(
                net.conv1.weight, mode="fan_out", nonlinearity="relu"
            )
        if small:
            net.maxpool = nn.Identity()
        return nn.Sequential(layers.AsImage(s), net)


class ConvNet(_ImageModel):
    """FedDM's ConvNet (docs/algorithms.md 10.2): ``depth`` blocks of a 3x3
    convolution of ``width`` channels, GroupNorm, ReLU and 2x2 average
    pooling, then one linear layer; grey images get padding 3 first (28x28
    reads as 32x32)."""

    name: Literal["convnet"] = "convnet"
    width: Width = 128
    depth: Annotated[int, Field(ge=1, le=16)] = 3

    def min_side(self, channels: int) -> int:
        """``depth`` poolings: 2^depth (less 4 for grey images, padded by 3)."""
        low = 2**self.depth
        return max(1, low - 4) if channels == 1 else low

    def _trunk(self, channels: int) -> list[size.Layer]:
        trunk: list[size.Layer] = []
        for d in range(self.depth):
            pad = 3 if channels == 1 and d == 0 else 1  # grey 28x28 -> 32x32
            trunk += [(self.width, 3, pad, True), size.POOL]
        return trunk

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """The network; ValueError for samples that are no image."""
        from fedsim import layers

        self._classes(num_classes)
        nn = torch.nn
        s = size.image_of(input_shape, "convnet")
        trunk: list[nn.Module] = []
        c = s[0]
        for d in range(self.depth):
            pad = 3 if s[0] == 1 and d == 0 else 1
            conv = nn.Conv2d(c, self.width, 3, padding=pad)
            norm = nn.GroupNorm(self.width, self.width, affine=True)
            trunk += [conv, norm, nn.ReLU(), nn.AvgPool2d(2, 2)]
            c = self.width
        head = lambda n: nn.Linear(n, num_classes)  # noqa: E731 - one layer
        return layers.ImageNet(s, nn.Sequential(*trunk), head)


class LSTM(_Classifier):
    """LEAF's Shakespeare model: a character embedding of ``embed_dim``,
    ``lstm_layers`` stacked LSTM layers of ``lstm_hidden`` units, and the
    next character; it reads sequences of character ids."""

    name: Literal["lstm"] = "lstm"
    embed_dim: Width = 8
    lstm_hidden: Width = 256
    lstm_layers: Annotated[int, Field(ge=1, le=16)] = 2

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """The network (``num_classes``: the vocabulary)."""
        from fedsim import layers

        self._classes(num_classes)
        if len(input_shape) != 1:
            raise ValueError(
                f"lstm reads sequences of character ids, got shape {input_shape}"
            )
        h, n = self.lstm_hidden, self.lstm_layers
        return layers.CharLSTM(num_classes, self.embed_dim, h, n)

    def param_count(self, input_shape: tuple[int, ...], num_classes: int) -> int:
        """Embedding, LSTM layers and head (:func:`model_size.lstm_params`)."""
        h, n = self.lstm_hidden, self.lstm_layers
        return size.lstm_params(self.embed_dim, h, n, num_classes)

    def data_problem(self, info: DataInfo) -> str | None:
        """Refuses anything but sequences."""
        if info.kind != "sequence":
            return (
                "lstm reads sequences of character ids (data: shakespeare), "
                f"not {info.kind}s; use logreg or mlp"
            )
        return super().data_problem(info)


# The built-in networks by name (fedsim.plugins looks a ``model.name`` up
# here first); DEFAULT is a scenario's model when it names none.
MODELS: dict[str, type[Model]] = {
    str(cls.model_fields["name"].default): cls
    for cls in (LogReg, MLP, Quadratic, CNN, CNNM, CifarCNN, VGG11, ResNet18)
    + (ConvNet, LSTM)
}
DEFAULT = "logreg"


def __getattr__(name: str) -> object:
    """Refuse the removed all-in-one ``ModelSpec``, naming what replaced it.

    Args:
        name: the attribute asked for.

    Raises:
        ImportError: ``name`` is ``ModelSpec``.
        AttributeError: no such name.
    """
    if name == "ModelSpec":
        raise ImportError(
            "fedsim.models.ModelSpec was removed: each built-in network is its "
            "own class, MODELS[name](its fields), e.g. MODELS['mlp'](hidden=[7])"
        )
    raise AttributeError(f"module 'fedsim.models' has no attribute {name!r}")


# ------------------------------------------------------- building and evaluating
def build_model(
    spec: Model,
    input_dim: int,
    num_classes: int,
    seed: int,
    start: float | None = None,
    input_shape: Sequence[int] | None = None,
) -> nn.Module:
    """``spec``'s network, its initial weights drawn from ``seed``.

    Args:
        spec: the ``model`` section (a built-in or a plug-in).
        input_dim: the flat sample size (used when ``input_shape`` is None).
        num_classes: the classes (0: an objective; lstm: the vocabulary).
        seed: seeds torch's generator for the build (the global RNG is left
            as it was).
        start: the value every parameter starts at (the data's
            ``start_value``); None: the network's own initialisation.
        input_shape: a sample's shape, e.g. (1, 28, 28).

    Returns:
        The network, converted to ``spec.dtype``.
    """
    shape = tuple(input_shape) if input_shape is not None else (int(input_dim),)
    plugin = type(spec) not in MODELS.values()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = spec.build(shape, num_classes)
        except Exception as exc:
            if not plugin:
                raise  # a built-in's failure is fedsim's bug: its traceback
            raise ModelError(
                f"model.name {spec.name!r}: build({shape}, {num_classes}) raised "
                f"{_raised(exc)}"
            ) from exc
        if plugin:
            _check_built(spec, model, shape, num_classes)
        if start is not None:  # set in float32, before the dtype conversion
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float(start))
    return model.to(getattr(torch, spec.dtype))


class ModelError(LoadError, ValueError):
    """A plug-in model misbehaves before training: its ``build`` raises,
    returns no torch module, disagrees with its ``param_count``, or gives
    outputs that do not match the dataset's classes. The message names the
    plug-in, the hook and what was expected (the CLI exits 2)."""


def _raised(exc: BaseException) -> str:
    """``Type: message (at file:line)`` of the last frame of the traceback
    outside fedsim: where the plug-in's code raised."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "/fedsim/" not in f.filename.replace("\\", "/")]
    at = f" (at {own[-1].filename}:{own[-1].lineno})" if own else ""
    return f"{type(exc).__name__}: {exc}{at}"


def _check_built(
    spec: Model, model: object, shape: tuple[int, ...], num_classes: int
) -> None:
    """Refuse a plug-in's network that does not do what the model stated:
    not a torch module, or trainable parameters other than its
    ``param_count`` (the memory check and ``fedsim validate`` trust that
    number: 10 stated against 14,000 built would pass them).

    Raises:
        ModelError: one line naming the plug-in, the hook and both values.
    """
    where = f"model.name {spec.name!r}"
    if not isinstance(model, torch.nn.Module):
        raise ModelError(
            f"{where}: build() returned {type(model).__name__}, expected a "
            "torch.nn.Module"
        )
    actual = sum(p.numel() for p in model.parameters() if p.requires_grad)
    stated = spec.param_count(shape, num_classes)
    if stated is not None and stated != actual:
        raise ModelError(
            f"{where}: param_count{(shape, num_classes)} states {stated} "
            f"parameters, but build() made {actual} trainable ones; return "
            "the network's count (or None where it cannot tell)"
        )


def _check_outputs(spec: Model, model: nn.Module, data: FederatedData) -> None:
    """Refuse a plug-in classifier trained with cross-entropy whose outputs
    for two of the dataset's samples are not one score per class each (a
    shape error deep in the loss, or a silent broadcast, otherwise).

    The forward pass runs in eval mode without gradients (no dropout draw,
    no batch-norm statistics moved), so the network and the generators are
    left exactly as built.

    Raises:
        ModelError: one line naming the plug-in, the hook and both shapes.
    """
    if spec.own_loss or data.num_classes <= 0 or len(data.x) == 0:
        return  # its own loss reads its own outputs
    where = f"model.name {spec.name!r}"
    x = as_tensor(data.x[:2])
    if x.is_floating_point():  # as training feeds it: in the model's dtype
        x = x.to(getattr(torch, spec.dtype))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as exc:
        raise ModelError(
            f"{where}: the network raised on the dataset's samples (shape "
            f"{tuple(x.shape[1:])}): {_raised(exc)}"
        ) from exc
    finally:
        model.train(was_training)
    got = tuple(getattr(out, "shape", ()))
    if got != (len(x), data.num_classes):
        raise ModelError(
            f"{where}: the network's outputs for {len(x)} samples have shape "
            f"{got}, expected ({len(x)}, {data.num_classes}): one score per class "
            "of the dataset"
        )


@dataclass(frozen=True)
class NetworkSetup:
    """How the run's network is built: the same on the server and on every
    worker, so every copy starts from the same bits.

    Attributes:
        model: the scenario's ``model`` section.
        seed: the run's seed; the initial weights come from a stream of
            their own derived from it.
        start: the value every parameter starts at when the data fixes it
            (``DatasetSpec.start_value``: the quadratic objectives' x_0);
            None: the network's own initialisation.
    """

    model: Model
    seed: int
    start: float | None = None

    @property
    def loss(self) -> Loss | None:
        """The model's own per-sample loss, or None: cross-entropy."""
        return self.model.loss if self.model.own_loss else None


def make_model(net: NetworkSetup, data: FederatedData) -> nn.Module:
    """The run's network for ``data``, initialised from the run's seed.

    Args:
        net: how to build it.
        data: the federated dataset (its sample shape and classes).

    Returns:
        The network, in the model's dtype, on the CPU.
    """
    ss = np.random.SeedSequence([net.seed, _MODEL_INIT_TAG])
    seed = int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))
    model = build_model(
        net.model, data.input_dim, data.num_classes, seed, net.start, data.x.shape[1:]
    )
    if type(net.model) not in MODELS.values():
        _check_outputs(net.model, model, data)
    return model


def batch_loss(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: Loss | None = None
) -> torch.Tensor:
    """Mean loss of a minibatch.

    Args:
        model: the network.
        x: the minibatch's samples.
        y: their targets.
        loss: the model's own per-sample loss (:attr:`NetworkSetup.loss`);
            None: cross-entropy.
    """
    if loss is not None:
        return loss(model(x), y).mean()
    return F.cross_entropy(model(x), y)


def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 4096,
    weights: np.ndarray | None = None,
    loss: Loss | None = None,
) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on (``x``, ``y``), in batches.

    Runs where ``model`` and ``x``, ``y`` are (one device for all three).

    Args:
        model: the network (put in eval mode for the pass, then back).
        x: the samples.
        y: their targets.
        batch_size: samples per forward pass.
        weights: per-sample weights of a model with its own loss (the
            quadratic objectives' p_i); None: equal.
        loss: the model's own per-sample loss; None: cross-entropy, whose
            mean is over samples (``weights`` unused, as always).

    Returns:
        The mean loss and the accuracy (NaN for targets that are no class
        labels); both NaN for no samples.
    """
    n = len(x)
    if n == 0:
        return float("nan"), float("nan")
    model.eval()
    try:
        with torch.no_grad():
            if loss is not None:
                return _own_loss(model, x, y, batch_size, weights, loss)
            total_loss, correct = 0.0, 0
            for start in range(0, n, batch_size):
                xb, yb = x[start : start + batch_size], y[start : start + batch_size]
                out = model(xb)
                total_loss += float(F.cross_entropy(out, yb, reduction="sum"))
                correct += int((out.argmax(dim=1) == yb).sum())
    finally:
        model.train()
    return total_loss / n, correct / n


def _own_loss(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    weights: np.ndarray | None,
    loss: Loss,
) -> tuple[float, float]:
    """:func:`evaluate` for a model with its own loss: the weighted mean of
    the per-sample losses (summed once, in float64, over every sample: the
    batches only bound the memory) and, for class labels, the accuracy."""
    n = len(x)
    w = torch.as_tensor(weights if weights is not None else np.ones(n)).double()
    per, correct = [], 0
    for start in range(0, n, batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        out = model(xb)
        per.append(loss(out, yb).double())
        if not yb.is_floating_point():
            correct += int((out.argmax(dim=1) == yb).sum())
    w = w.to(x.device)
    mean = float((torch.cat(per) * w).sum() / w.sum())
    return mean, (correct / n if not y.is_floating_point() else float("nan"))
