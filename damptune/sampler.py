"""A seeded per-epoch permutation sampler whose whole state is two integers."""

from __future__ import annotations

import numpy as np

__all__ = ["EpochSampler", "split_shares"]


class EpochSampler:
    """Draws batches of any size from a fresh seeded permutation of ``range(n)`` each epoch.

    The permutation of epoch ``e`` is a pure function of ``(seed, e)``, so the sampler's state is
    ``(epoch, position)``. A batch that runs past the end of an epoch continues at the head of
    the next epoch's permutation, so every example is seen exactly once per epoch.

    Example:
        >>> s = EpochSampler(5, seed=0)
        >>> len(s.take(3)), len(s.take(3)), s.state_dict()
        (3, 3, {'epoch': 1, 'position': 1})
    """

    def __init__(self, n: int, *, seed: int) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of examples in ``epoch``."""
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm, self._perm_epoch = rng.permutation(self.n).astype(np.int64), epoch
        return self._perm

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` example indices."""
        parts = []
        while count > 0:
            perm = self.permutation(self.epoch)
            chunk = perm[self.position : self.position + count]
            parts.append(chunk)
            count -= len(chunk)
            self.position += len(chunk)
            if self.position == self.n:
                self.epoch, self.position = self.epoch + 1, 0
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def split_shares(indices: np.ndarray, n_ranks: int) -> list[np.ndarray]:
    """Split a global batch into ``n_ranks`` contiguous shares (sizes differ by at most one)."""
    return [np.ascontiguousarray(s) for s in np.array_split(indices, n_ranks)]
