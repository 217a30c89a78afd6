"""Parameter counts of fedsim's built-in networks, by formula (no torch), so
that ``fedsim validate`` and the memory check can size a model without
building it. :meth:`fedsim.spec.ModelSpec.param_count` answers with these;
tests/test_cli_startup.py checks them against the real networks of
:mod:`fedsim.models`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

IMAGE_MODELS = ("cnn", "cnn_m", "cifar_cnn", "vgg11", "resnet18", "convnet")


def _conv(c_in: int, c_out: int, k: int, bias: bool = True) -> int:
    return c_out * c_in * k * k + (c_out if bias else 0)


def _dense_params(width: int, hidden: Sequence[int], classes: int) -> int:
    """Linear layers ``width -> hidden... -> classes`` (fedsim.models._dense)."""
    widths = [width, *hidden, classes]
    return sum(a * b + b for a, b in zip(widths, widths[1:], strict=False))


def _resnet18_params(c: int, small: bool, classes: int) -> int:
    """torchvision's ResNet-18 with GroupNorm and a 3x3 stem for small images."""
    total = _conv(c, 64, 3 if small else 7, bias=False) + 2 * 64
    width = 64
    for planes in (64, 128, 256, 512):
        for _ in range(2):
            total += _conv(width, planes, 3, False) + _conv(planes, planes, 3, False)
            total += 4 * planes  # two GroupNorms
            if width != planes:  # a stage's first block: a stride-2 1x1 shortcut
                total += _conv(width, planes, 1, False) + 2 * planes
            width = planes
    return total + 512 * classes + classes


# A layer of an image network: a convolution (out channels, kernel, padding,
# followed by a GroupNorm?) or a 2x2 pooling that halves the image.
_Layer = tuple[int, int, int, bool] | str
_POOL = "pool"
_VGG11 = (64, _POOL, 128, _POOL, 256, 256, _POOL, 512, 512, _POOL, 512, 512, _POOL)


# The image networks without size fields: their layers and hidden widths.
_FIXED: dict[str, tuple[list[_Layer], list[int]]] = {
    "cnn": ([(32, 5, 2, False), _POOL, (64, 5, 2, False), _POOL], [512]),
    "cnn_m": ([(10, 5, 0, False), _POOL, (20, 5, 0, False), _POOL], [50]),  # FedPNS
    "cifar_cnn": ([(64, 5, 0, False), _POOL, (64, 5, 0, False), _POOL], [384, 192]),
}


def _image_layers(spec: Any, channels: int) -> tuple[list[_Layer], list[int]]:
    """An image network's convolutions and poolings, and its hidden widths."""
    if spec.name in _FIXED:
        fixed, hidden = _FIXED[spec.name]
        return list(fixed), list(hidden)
    if spec.name == "vgg11":
        return [v if v == _POOL else (int(v), 3, 1, True) for v in _VGG11], [512, 512]
    if spec.name == "convnet":
        layers: list[_Layer] = []
        for d in range(spec.depth):
            pad = 3 if channels == 1 and d == 0 else 1  # grey 28x28 -> 32x32
            layers += [(spec.width, 3, pad, True), _POOL]
        return layers, []
    raise ValueError(f"not an image network: {spec.name!r}")


def image_params(spec: Any, image: tuple[int, int, int], classes: int) -> int:
    """Parameters of an image network of :mod:`fedsim.models` on [C, H, W] images.

    Raises:
        ValueError: the image shrinks to nothing inside the network.

    >>> from fedsim.spec import ModelSpec
    >>> image_params(ModelSpec(name="cnn"), (1, 28, 28), 10)   # McMahan et al. 2017
    1663370
    """
    c, h, w = image
    if spec.name == "resnet18":
        return _resnet18_params(c, max(h, w) <= 32, classes)
    layers, hidden = _image_layers(spec, c)
    total = 0
    for layer in layers:
        if isinstance(layer, str):
            h, w = h // 2, w // 2
        else:
            out, k, pad, norm = layer
            total += _conv(c, out, k) + (2 * out if norm else 0)
            h, w, c = h + 2 * pad + 1 - k, w + 2 * pad + 1 - k, out
        if min(h, w) < 1:
            raise ValueError(
                f"model.name {spec.name!r}: {image[0]}x{image[1]}x{image[2]} "
                "images are too small for it (a layer's output would be empty)"
            )
    return total + _dense_params(c * h * w, hidden, classes)


def _lstm_params(spec: Any, classes: int) -> int:
    """LEAF's character LSTM: embedding, stacked LSTM layers, linear head
    (``classes`` is the vocabulary, in and out)."""
    h, total, width = spec.lstm_hidden, classes * spec.embed_dim, spec.embed_dim
    for _ in range(spec.lstm_layers):
        total += 4 * h * (width + h) + 8 * h  # W_ih, W_hh and two biases
        width = h
    return total + h * classes + classes


def builtin_params(
    spec: Any, input_shape: tuple[int, ...], num_classes: int | None
) -> int | None:
    """Parameters of the built-in network ``spec`` (a ``ModelSpec``) reading
    samples of ``input_shape``: [C, H, W] images, or vectors (an image network
    reads a square vector as a grey image); None where the classes are unknown
    or an image network gets samples it cannot read.

    >>> from fedsim.spec import ModelSpec
    >>> builtin_params(ModelSpec(name="logreg"), (60,), 10)
    610
    """
    if spec.name == "quadratic":
        return math.prod(input_shape)
    if num_classes is None:
        return None
    if spec.name in ("logreg", "mlp"):
        hidden = spec.hidden if spec.name == "mlp" else []
        return _dense_params(math.prod(input_shape), hidden, num_classes)
    if spec.name == "lstm":
        return _lstm_params(spec, num_classes)
    image = _image_shape(input_shape)
    return None if image is None else image_params(spec, image, num_classes)


def _image_shape(shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """[C, H, W] as given, or a square vector as one grey channel."""
    if len(shape) == 3:
        return (shape[0], shape[1], shape[2])
    side = math.isqrt(shape[0]) if len(shape) == 1 else 0
    return (1, side, side) if side and side * side == shape[0] else None
