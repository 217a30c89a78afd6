"""Model registry: build a network by name, compute its loss, evaluate it.

Networks: :data:`MODELS` and quadratic (docs/datasets.md, "Models"). None uses dropout
or batch norm (GroupNorm instead): training depends only on client data and generator.

Example:
    >>> m = build_model(ModelSpec(name="logreg"), input_dim=60, num_classes=10, seed=0)
    >>> sum(p.numel() for p in m.parameters())
    610
    >>> m = build_model(ModelSpec(name="cnn"), 784, 10, 0, input_shape=(1, 28, 28))
    >>> sum(p.numel() for p in m.parameters())   # as in the FedAvg paper
    1663370
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.data.base import FederatedData
from fedsim.spec import Model, ModelSpec  # there: validating a scenario needs no torch

_MODEL_INIT_TAG = 0x1A17


class QuadraticModel(nn.Module):
    """Parameters x; ``forward(e, h)``: per-sample h/2 ||x - e||^2 (centres e)."""

    def __init__(self, dim: int, x0: float = 0.0) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.full((dim,), float(x0)))

    def forward(self, e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return 0.5 * h * ((self.x - e) ** 2).sum(dim=1)


class _AsImage(nn.Module):
    """Reshape flat rows to [B, C, H, W] (a no-op for image batches)."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


_Head = Callable[[int], nn.Module]


class _ImageNet(nn.Module):
    """``features`` then ``classifier``; ``embed`` (flat features) serves FedDM."""

    def __init__(
        self, shape: tuple[int, int, int], features: nn.Module, head: _Head
    ) -> None:
        super().__init__()
        self.reshape = _AsImage(shape)
        self.features = features
        with torch.no_grad():
            flat = features(torch.zeros(1, *shape)).flatten(1).shape[1]
        self.classifier = head(flat)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(self.reshape(x)).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: embedding, stacked LSTM, next character."""

    def __init__(self, vocab: int, embed: int = 8, hidden: int = 256, layers: int = 2):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embedding(x.long()))
        return self.out(h[:, -1])


def _image_shape(input_shape: Sequence[int], name: str) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in input_shape)
    if len(shape) == 3:
        return shape  # type: ignore[return-value]
    if len(shape) == 1:  # flat grey images, e.g. 784 = 1 x 28 x 28
        side = math.isqrt(shape[0])
        if side * side == shape[0]:
            return (1, side, side)
    raise ValueError(
        f"model {name!r} needs images [C, H, W]; the data's samples have shape {shape}"
    )


def _gn(groups: int, channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(groups, channels), channels)


def _dense(width: int, hidden: Sequence[int], classes: int) -> list[nn.Module]:
    """Linear layers ``width -> hidden... -> classes``, ReLUs between."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return layers


def _head(hidden: Sequence[int], classes: int) -> _Head:
    """Classifier: flattened features ``n`` -> ``hidden`` -> ``classes``."""
    return lambda n: nn.Sequential(*_dense(n, hidden, classes))


def _conv_pool(c_in: int, widths: Sequence[int], padding: int = 0) -> nn.Sequential:
    """[conv5x5(width), ReLU, maxpool2] per width: the FedAvg and FedDC CNNs."""
    layers: list[nn.Module] = []
    for c_out in widths:
        conv = nn.Conv2d(c_in, c_out, 5, padding=padding)
        layers += [conv, nn.ReLU(), nn.MaxPool2d(2)]
        c_in = c_out
    return nn.Sequential(*layers)


def _mlp(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    """Dense layers on flat samples; logreg: the one without hidden layers
    (all zeros with ``zero_init``)."""
    hidden = spec.hidden if spec.name == "mlp" else []
    net = nn.Sequential(nn.Flatten(), *_dense(int(np.prod(shape)), hidden, classes))
    if spec.name == "logreg" and spec.zero_init:
        with torch.no_grad():
            for p in net.parameters():
                p.zero_()
    return net


def _cnn(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    """McMahan et al. 2017, section 3: 1,663,370 parameters on 28x28x1."""
    s = _image_shape(shape, "cnn")
    return _ImageNet(s, _conv_pool(s[0], [32, 64], padding=2), _head([512], classes))


def _cnn_m(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    """FedPNS's CNN-M (docs/algorithms.md 14, FedPNS): conv(10, 5x5),
    conv(20, 5x5), each with 2x2 max-pooling, FC 320 -> 50 -> classes, no
    dropout; 21,840 parameters on 28x28x1."""
    s = _image_shape(shape, "cnn_m")
    return _ImageNet(s, _conv_pool(s[0], [10, 20]), _head([50], classes))


def _cifar_cnn(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    """The FedDC/FedDyn code's CIFAR CNN (docs/algorithms.md 9.3)."""
    s = _image_shape(shape, "cifar_cnn")
    return _ImageNet(s, _conv_pool(s[0], [64, 64]), _head([384, 192], classes))


def _vgg11(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's VGG-11 (config A), GroupNorm, FedNova's classifier sans dropout."""
    from torchvision.models.vgg import cfgs, make_layers

    s = _image_shape(shape, "vgg11")
    if min(s[1:]) < 32:
        raise ValueError(f"vgg11 halves the image 5 times; it needs >= 32x32, got {s}")
    layers = [  # make_layers is flat: [conv, BatchNorm2d, ReLU, (maxpool)] per entry
        _gn(spec.norm_groups, m.num_features) if isinstance(m, nn.BatchNorm2d) else m
        for m in make_layers(cfgs["A"], batch_norm=True)
    ]
    if s[0] != 3:
        layers[0] = nn.Conv2d(s[0], cfgs["A"][0], 3, padding=1)
    return _ImageNet(s, nn.Sequential(*layers), _head([512, 512], classes))


def _resnet18(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's ResNet-18, GroupNorm; the CIFAR stem for images <= 32x32."""
    from torchvision.models import resnet18

    s = _image_shape(shape, "resnet18")
    norm = partial(_gn, spec.norm_groups)
    net = resnet18(weights=None, num_classes=classes, norm_layer=norm)
    small = max(s[1:]) <= 32
    if small or s[0] != 3:
        k, stride, pad = (3, 1, 1) if small else (7, 2, 3)
        net.conv1 = nn.Conv2d(s[0], 64, k, stride, pad, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    if small:
        net.maxpool = nn.Identity()
    return nn.Sequential(_AsImage(s), net)


def _convnet(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    """FedDM's ConvNet (docs/algorithms.md 10.2); 1-channel images: first padding 3."""
    s = _image_shape(shape, "convnet")
    layers: list[nn.Module] = []
    c = s[0]
    for d in range(spec.depth):
        conv = nn.Conv2d(c, spec.width, 3, padding=3 if s[0] == 1 and d == 0 else 1)
        norm = nn.GroupNorm(spec.width, spec.width, affine=True)
        layers += [conv, norm, nn.ReLU(), nn.AvgPool2d(2, 2)]
        c = spec.width
    return _ImageNet(s, nn.Sequential(*layers), lambda n: nn.Linear(n, classes))


def _lstm(spec: ModelSpec, shape: tuple[int, ...], classes: int) -> nn.Module:
    if len(shape) != 1:
        raise ValueError(f"lstm reads sequences of character ids, got shape {shape}")
    return CharLSTM(classes, spec.embed_dim, spec.lstm_hidden, spec.lstm_layers)


MODELS: dict[str, Callable[[ModelSpec, tuple[int, ...], int], nn.Module]] = {
    "logreg": _mlp,
    "mlp": _mlp,
    "cnn": _cnn,
    "cnn_m": _cnn_m,
    "cifar_cnn": _cifar_cnn,
    "vgg11": _vgg11,
    "resnet18": _resnet18,
    "convnet": _convnet,
    "lstm": _lstm,
}
"""Every network but ``quadratic``: ``factory(spec, sample_shape, num_classes)``."""


def build_model(
    spec: ModelSpec | Model,
    input_dim: int,
    num_classes: int,
    seed: int,
    x0: float = 0.0,
    input_shape: Sequence[int] | None = None,
) -> nn.Module:
    """``spec``'s network, initial weights drawn from ``seed`` (not the global RNG);
    a sample's shape is ``input_shape`` (e.g. (1, 28, 28)) or ``(input_dim,)``,
    ``num_classes`` lstm's vocabulary, ``x0`` quadratic's initial value."""
    shape = tuple(input_shape) if input_shape is not None else (int(input_dim),)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if isinstance(spec, Model):  # a plug-in builds its own network
            model: nn.Module = spec.build(shape, num_classes)
        elif spec.name == "quadratic":
            model = QuadraticModel(int(np.prod(shape)), x0)
        elif spec.name in MODELS:
            if num_classes < 1:
                raise ValueError(f"model {spec.name!r} needs a dataset with classes")
            model = MODELS[spec.name](spec, shape, num_classes)
        else:
            raise ValueError(f"unknown model {spec.name!r}")
    return model.to(getattr(torch, spec.dtype))


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

    model: ModelSpec | Model
    seed: int
    start: float | None = None


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
    x0 = 0.0 if net.start is None else net.start
    return build_model(
        net.model, data.input_dim, data.num_classes, seed, x0, data.x.shape[1:]
    )


def batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean loss of a minibatch: cross-entropy, or the model's own objective."""
    if isinstance(model, QuadraticModel):
        return model(x, y).mean()
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 4096,
    weights: np.ndarray | None = None,
) -> tuple[float, float]:
    """(mean loss, accuracy) in batches; accuracy NaN without classes.

    Runs where ``model`` and ``x``, ``y`` are (one device for all three).
    """
    model.eval()
    n = len(x)
    if n == 0:
        return float("nan"), float("nan")
    if isinstance(model, QuadraticModel):
        w = torch.as_tensor(weights if weights is not None else np.ones(n)).double()
        w = w.to(x.device)
        return float((model(x, y).double() * w).sum() / w.sum()), float("nan")
    total_loss, correct = 0.0, 0
    for start in range(0, n, batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        out = model(xb)
        total_loss += float(F.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(dim=1) == yb).sum())
    model.train()
    return total_loss / n, correct / n
