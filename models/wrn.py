"""Wide residual network (Zagoruyko & Komodakis, 2016), WRN-16-4 by default, for GPU runs."""

from __future__ import annotations

import torch
from torch import nn

from models._checks import check_int, check_shape

__all__ = ["WideResNet"]


class _Block(nn.Module):
    """Pre-activation basic block: BN-ReLU-conv3x3-(dropout)-BN-ReLU-conv3x3, plus shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.shortcut: nn.Module | None = None
        if c_in != c_out or stride != 1:
            self.shortcut = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(x))
        # A projection shortcut takes the pre-activated input, as in the reference code.
        residual = x if self.shortcut is None else self.shortcut(out)
        out = self.conv1(out)
        out = self.conv2(self.dropout(torch.relu(self.bn2(out))))
        return out + residual


class WideResNet(nn.Module):
    """Wide-ResNet-``depth``-``widen_factor`` for image classification (CIFAR-10 by default).

    The standard architecture: a 3x3 stem with 16 channels, three groups of ``(depth - 4) / 6``
    pre-activation basic blocks with ``16k``, ``32k`` and ``64k`` channels (``k`` =
    ``widen_factor``; the last two groups halve the resolution), then BatchNorm, ReLU, global
    average pooling and a linear layer. WRN-16-4 has ≈2.75M parameters; it is meant for a GPU.

    Note:
        This model uses **BatchNorm**, which couples the examples of a batch: in training mode
        each rank normalizes with the statistics of its own shard, so the gradient of a batch is
        *not* the sum of the gradients of its shards, and the running statistics differ between
        ranks. The exact shard-sum equivalence the engine tests holds only for the BatchNorm-free
        models (``MLP``, ``CNN``). With ``dropout > 0`` the forward pass in training mode is also
        random.

    Args:
        input_shape: Shape of one image without the batch dimension, ``(C, H, W)``, e.g.
            ``(3, 32, 32)`` for CIFAR-10. Any size works (global average pooling).
        n_classes: Number of output logits.
        depth: Total depth; ``depth - 4`` must be a positive multiple of 6 (10, 16, 22, 28...).
        widen_factor: Width multiplier ``k`` of the residual groups.
        dropout: Dropout probability between the two convolutions of each block.

    Raises:
        ValueError: If ``input_shape`` is not ``(C, H, W)``, ``depth`` is not ``6n + 4``, or
            another argument is out of range.

    Example:
        >>> import torch
        >>> model = WideResNet(input_shape=(3, 32, 32), n_classes=10).eval()
        >>> model(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        *,
        input_shape: tuple[int, ...],
        n_classes: int,
        depth: int = 16,
        widen_factor: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.input_shape = check_shape(input_shape, ndims=(3,))
        self.n_classes = check_int("n_classes", n_classes)
        depth = check_int("depth", depth, minimum=10, what="6n + 4, e.g. 16 or 28")
        if (depth - 4) % 6:
            raise ValueError(
                f"depth={depth!r} is not accepted; expected 6n + 4 with n >= 1 "
                "(10, 16, 22, 28, 34, 40...)."
            )
        widen_factor = check_int("widen_factor", widen_factor)
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, int | float)
            or not (0.0 <= dropout < 1.0)
        ):
            raise ValueError(f"dropout={dropout!r} is not accepted; expected a float in [0, 1).")
        n_blocks = (depth - 4) // 6
        widths = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        layers: list[nn.Module] = [nn.Conv2d(self.input_shape[0], 16, 3, padding=1, bias=False)]
        c_in = 16
        for width, stride in zip(widths, (1, 2, 2), strict=True):
            for i in range(n_blocks):
                layers.append(_Block(c_in, width, stride if i == 0 else 1, float(dropout)))
                c_in = width
        layers += [nn.BatchNorm2d(c_in), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c_in, self.n_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of shape ``(N, C, H, W)`` to logits of shape ``(N, n_classes)``."""
        return self.classifier(self.features(x))
