"""Multi-layer perceptron: the MNIST-1D paper's MLP baseline, for any input shape."""

from __future__ import annotations

import math

import torch
from torch import nn

from models._checks import check_int, check_shape

__all__ = ["MLP"]


class MLP(nn.Module):
    """Fully connected ReLU network that flattens its input.

    There is no dropout and no batch normalization, and the forward pass draws no random
    numbers, so every example's output depends on that example alone: the gradient of a loss
    summed over a batch equals the sum of the gradients over the batch's shards, which is what
    the data-parallel engine relies on.

    With the defaults (two hidden layers of 100 units) it is the MLP of the MNIST-1D paper
    (Greydanus, 2020): 15,210 parameters on MNIST-1D's 40 features.

    Args:
        input_shape: Shape of one example, without the batch dimension, e.g. ``(40,)`` for
            MNIST-1D or ``(1, 8, 8)`` for the 8x8 digits. The input is flattened.
        n_classes: Number of output logits.
        hidden: Units in each hidden layer.
        depth: Number of hidden layers (``0`` gives multinomial logistic regression).

    Raises:
        ValueError: If a size is not a positive int or ``depth`` is negative.

    Example:
        >>> import torch
        >>> model = MLP(input_shape=(40,), n_classes=10)
        >>> model(torch.zeros(8, 40)).shape
        torch.Size([8, 10])
    """

    def __init__(
        self, *, input_shape: tuple[int, ...], n_classes: int, hidden: int = 100, depth: int = 2
    ) -> None:
        super().__init__()
        self.input_shape = check_shape(input_shape)
        self.n_classes = check_int("n_classes", n_classes)
        hidden = check_int("hidden", hidden, what="units per hidden layer")
        depth = check_int("depth", depth, minimum=0, what="number of hidden layers")
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(self.input_shape)
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, self.n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of shape ``(N, *input_shape)`` to logits of shape ``(N, n_classes)``."""
        return self.net(x)
