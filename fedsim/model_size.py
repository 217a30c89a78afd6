"""Parameter-count formulas for the layers fedsim's networks are made of, with
no torch, so that ``fedsim validate`` and the memory check can size a model
without building it. Each built-in network (:mod:`fedsim.models`) states its
own count with these; tests/test_cli_startup.py checks every count against
the real network.

Example:
    >>> conv_params(1, 32, 5)                       # 32 5x5 filters and biases
    832
    >>> dense_params(60, [], 10)                    # logistic regression
    610
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# A layer of an image network: a convolution (out channels, kernel, padding,
# followed by a GroupNorm?) or a 2x2 pooling that halves the image.
Layer = tuple[int, int, int, bool] | str
POOL = "pool"


def conv_params(c_in: int, c_out: int, k: int, bias: bool = True) -> int:
    """A ``k`` x ``k`` convolution from ``c_in`` to ``c_out`` channels."""
    return c_out * c_in * k * k + (c_out if bias else 0)


def dense_params(width: int, hidden: Sequence[int], classes: int) -> int:
    """Linear layers ``width -> hidden... -> classes``, each with its bias."""
    widths = [width, *hidden, classes]
    return sum(a * b + b for a, b in zip(widths, widths[1:], strict=False))


def as_image(shape: Sequence[int]) -> tuple[int, int, int] | None:
    """The [C, H, W] an image network reads samples of ``shape`` as: the
    shape itself, or a square vector as one grey channel; None otherwise.

    >>> as_image((784,)), as_image((3, 32, 32)), as_image((60,))
    ((1, 28, 28), (3, 32, 32), None)
    """
    if len(shape) == 3:
        return (int(shape[0]), int(shape[1]), int(shape[2]))
    side = math.isqrt(int(shape[0])) if len(shape) == 1 else 0
    return (1, side, side) if side and side * side == shape[0] else None


def image_of(shape: Sequence[int], name: str) -> tuple[int, int, int]:
    """:func:`as_image`, refusing samples that are no image.

    Raises:
        ValueError: naming the model ``name`` and the samples' shape.
    """
    image = as_image(shape)
    if image is None:
        raise ValueError(
            f"model {name!r} needs images [C, H, W]; the data's samples have "
            f"shape {tuple(shape)}"
        )
    return image


def image_params(
    name: str,
    layers: Sequence[Layer],
    hidden: Sequence[int],
    image: tuple[int, int, int],
    classes: int,
) -> int:
    """Parameters of a trunk of convolutions and poolings on [C, H, W] images
    followed by a dense head (``hidden`` widths, then ``classes``).

    Raises:
        ValueError: the image shrinks to nothing inside the network (the
            message names the model ``name``).

    >>> image_params("cnn", [(32, 5, 2, False), POOL, (64, 5, 2, False), POOL],
    ...              [512], (1, 28, 28), 10)           # McMahan et al. 2017
    1663370
    """
    c, h, w = image
    total = 0
    for layer in layers:
        if isinstance(layer, str):
            h, w = h // 2, w // 2
        else:
            out, k, pad, norm = layer
            total += conv_params(c, out, k) + (2 * out if norm else 0)
            h, w, c = h + 2 * pad + 1 - k, w + 2 * pad + 1 - k, out
        if min(h, w) < 1:
            raise ValueError(
                f"model.name {name!r}: {image[0]}x{image[1]}x{image[2]} "
                "images are too small for it (a layer's output would be empty)"
            )
    return total + dense_params(c * h * w, hidden, classes)


def resnet18_params(c: int, small: bool, classes: int) -> int:
    """torchvision's ResNet-18 with GroupNorm, on ``c`` channels; ``small``
    images get a 3x3 stem (no 7x7 convolution)."""
    total = conv_params(c, 64, 3 if small else 7, bias=False) + 2 * 64
    width = 64
    for planes in (64, 128, 256, 512):
        for _ in range(2):
            total += conv_params(width, planes, 3, False)
            total += conv_params(planes, planes, 3, False)
            total += 4 * planes  # two GroupNorms
            if width != planes:  # a stage's first block: a stride-2 1x1 shortcut
                total += conv_params(width, planes, 1, False) + 2 * planes
            width = planes
    return total + 512 * classes + classes


def lstm_params(embed: int, hidden: int, layers: int, vocab: int) -> int:
    """An embedding, ``layers`` stacked LSTM layers and a linear head, with
    ``vocab`` tokens in and out (LEAF's character LSTM)."""
    total, width = vocab * embed, embed
    for _ in range(layers):
        total += 4 * hidden * (width + hidden) + 8 * hidden  # W_ih, W_hh, biases
        width = hidden
    return total + hidden * vocab + vocab
