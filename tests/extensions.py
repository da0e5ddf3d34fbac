"""A damper and a model added the way CONTRIBUTING.md says (used by test_extension_points)."""

from __future__ import annotations

import math

from torch import nn

from damptune.dampers import Damper, Param, Progress


class DoublingDamp(Damper):
    """``d = B0 · 2^⌊updates / every⌋``: doubles every ``every`` updates."""

    name = "doublingdamp"
    search_space = (
        Param("every", 1, 50, integer=True, unit="updates", doc="updates per doubling"),
    )

    def __init__(self, *, initial: int = 32, dwell: int = 1, every: int = 2) -> None:
        super().__init__(initial=initial, dwell=dwell)
        self.every = every

    def raw_damping(self, progress: Progress) -> float:
        return self.initial * 2.0 ** math.floor(progress.update / self.every)


class TinyNet(nn.Module):
    """One linear layer: the smallest model the registry accepts."""

    def __init__(self, *, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), n_classes)

    def forward(self, x):  # noqa: ANN001, D102
        return self.linear(x.flatten(1))
