"""Small convolutional network: the MNIST-1D paper's CNN, with a 2-D analogue for images."""

from __future__ import annotations

import math

import torch
from torch import nn

from models._checks import check_int, check_shape

__all__ = ["CNN"]

# (kernel, stride, padding) of the three convolutions, as in the MNIST-1D paper's ConvBase.
_LAYERS: tuple[tuple[int, int, int], ...] = ((5, 2, 1), (3, 2, 1), (3, 2, 1))


class CNN(nn.Module):
    """Three strided ReLU convolutions and a linear classifier.

    For 1-D examples (``input_shape == (L,)``, or ``(C, L)`` for ``C`` channels) this is the
    CNN of the MNIST-1D paper (Greydanus, 2020): ``Conv1d`` layers with kernels 5, 3, 3, stride
    2, padding 1 and ``channels`` channels each, then a linear layer on the flattened features.
    On MNIST-1D (``L = 40``) it has 5,210 parameters and the paper reports ≈94 % test accuracy.
    For images (``input_shape == (C, H, W)``, e.g. ``(1, 8, 8)`` digits or ``(3, 32, 32)``
    CIFAR-10) the same layers are ``Conv2d``.

    There is no dropout and no batch normalization, and the forward pass draws no random
    numbers, so the gradient of a loss summed over a batch equals the sum of the gradients over
    the batch's shards (what the data-parallel engine relies on).

    Args:
        input_shape: Shape of one example without the batch dimension: ``(L,)``, ``(C, L)`` or
            ``(C, H, W)``. Each spatial size must be at least 3.
        n_classes: Number of output logits.
        channels: Channels of each convolution.

    Raises:
        ValueError: If ``input_shape`` has another number of dimensions or a spatial size below
            3, or a size is not a positive int.

    Example:
        >>> import torch
        >>> model = CNN(input_shape=(40,), n_classes=10)
        >>> model(torch.zeros(8, 40)).shape
        torch.Size([8, 10])
        >>> sum(p.numel() for p in model.parameters())
        5210
    """

    def __init__(
        self, *, input_shape: tuple[int, ...], n_classes: int, channels: int = 25
    ) -> None:
        super().__init__()
        self.input_shape = check_shape(input_shape, ndims=(1, 2, 3))
        self.n_classes = check_int("n_classes", n_classes)
        channels = check_int("channels", channels, what="channels per convolution")
        # Shape the convolutions see: (channels_in, *spatial).
        conv_shape = (1, *self.input_shape) if len(self.input_shape) == 1 else self.input_shape
        if min(conv_shape[1:]) < 3:
            raise ValueError(
                f"input_shape={input_shape!r} is not accepted by CNN; expected every spatial "
                "size >= 3 (the first convolution has kernel 5 and padding 1). Use MLP instead."
            )
        self._conv_shape = conv_shape
        conv = nn.Conv1d if len(conv_shape) == 2 else nn.Conv2d
        layers: list[nn.Module] = []
        c_in, spatial = conv_shape[0], conv_shape[1:]
        for kernel, stride, padding in _LAYERS:
            layers += [conv(c_in, channels, kernel, stride=stride, padding=padding), nn.ReLU()]
            c_in = channels
            spatial = tuple((s + 2 * padding - kernel) // stride + 1 for s in spatial)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels * math.prod(spatial), self.n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of shape ``(N, *input_shape)`` to logits of shape ``(N, n_classes)``."""
        x = self.features(x.reshape(x.shape[0], *self._conv_shape))
        return self.classifier(x.flatten(1))
