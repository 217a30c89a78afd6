"""The torch layers fedsim's built-in networks are made of (imported by their
``build`` methods only, so that loading a scenario never imports torch).

:mod:`fedsim.models` describes each network (its fields, parameter count and
data it reads); the modules here are what those descriptions build: the
quadratic objective's point, the image networks' trunk and head, LEAF's
character LSTM, and the small helpers that assemble them. None uses dropout
or batch norm (GroupNorm instead): training depends only on client data and
the generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn


class QuadraticModel(nn.Module):
    """The quadratic objectives' model: parameters x (zeros: the data's
    ``start_value`` sets them), ``forward(e)`` the per-sample distance
    ||x - e||^2 / 2 to the centres e; the ``quadratic`` model's loss hook
    weighs it by the curvature h (``h * forward(e)``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(dim))

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((self.x - e) ** 2).sum(dim=1)


class AsImage(nn.Module):
    """Reshape flat rows to [B, C, H, W] (a no-op for image batches)."""

    shape: tuple[int, ...]

    def __init__(self, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


Head = Callable[[int], nn.Module]


class ImageNet(nn.Module):
    """``features`` then ``classifier``; ``embed`` (flat features) serves FedDM."""

    def __init__(
        self, shape: tuple[int, int, int], features: nn.Module, head: Head
    ) -> None:
        super().__init__()
        self.reshape = AsImage(shape)
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


def group_norm(groups: int, channels: int) -> nn.GroupNorm:
    """GroupNorm over ``channels`` in ``gcd(groups, channels)`` groups (the
    networks' batch-norm replacement: no running statistics)."""
    return nn.GroupNorm(math.gcd(groups, channels), channels)


def dense(width: int, hidden: Sequence[int], classes: int) -> list[nn.Module]:
    """Linear layers ``width -> hidden... -> classes``, ReLUs between."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return layers


def head(hidden: Sequence[int], classes: int) -> Head:
    """Classifier: flattened features ``n`` -> ``hidden`` -> ``classes``."""
    return lambda n: nn.Sequential(*dense(n, hidden, classes))


def conv_pool(c_in: int, widths: Sequence[int], padding: int = 0) -> nn.Sequential:
    """[conv5x5(width), ReLU, maxpool2] per width: the FedAvg and FedDC CNNs."""
    layers: list[nn.Module] = []
    for c_out in widths:
        conv = nn.Conv2d(c_in, c_out, 5, padding=padding)
        layers += [conv, nn.ReLU(), nn.MaxPool2d(2)]
        c_in = c_out
    return nn.Sequential(*layers)
