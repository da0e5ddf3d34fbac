"""Stragglers: each rank's compute time per update, drawn from a profile's distribution.

A synchronous update waits for its slowest rank. A straggler profile says how a rank's
compute time varies from update to update: with probability ``p`` (per rank, per update) a
rank is slowed by a factor drawn uniformly in ``[low, high]``; a share ``slow_fraction`` of
the ranks may also be slow on every update (``slow_factor``), as a machine of a spot cluster
that is older or shared. The named profile ``aws-5pct`` is the measurement the project's
lecture notes cite for AWS: about 5 % of iterations take 2-3x the latency of the rest.

The draws are a function of (seed, update, rank) alone, never of a generator's state, so a
resumed run draws what the uninterrupted run drew, and two runs of one seed draw the same.
A persistently slow rank is chosen per (seed, rank), so it stays slow as P changes.

With ``factor_i`` the draw of rank ``i`` of ``P`` and ``c`` the compute seconds of a share::

    synchronous update:  compute = c · max_i factor_i      waiting = c · (max_i factor_i − 1)

The expected slowest factor of ``P`` transient draws (no persistently slow rank), with
``q = 1 − p`` and ``w = high − low``::

    E[max] = 1 + (low − 1)(1 − q^P) + w − w (1 − q^(P+1)) / (p (P + 1))

(:meth:`Stragglers.expected_slowest`; ``bench/stragglers.py`` checks the engine's draws
against it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from damptune.errors import ConfigError

__all__ = ["Stragglers", "AWS_5PCT"]

_TRANSIENT, _PERSISTENT = 0x5157, 0x5158  # streams of the draws, apart from the training's


@dataclass(frozen=True)
class Stragglers:
    """How slow each rank's compute is on an update (a factor >= 1 of its share's time)."""

    p: float  # probability per rank and update of a transient slowdown
    low: float = 2.0  # its factor, uniform in [low, high]
    high: float = 3.0
    slow_fraction: float = 0.0  # share of the ranks slow on every update
    slow_factor: float = 1.0  # their factor (it multiplies a transient one)

    def __post_init__(self) -> None:
        for name, lo, hi in (("p", 0.0, 1.0), ("slow_fraction", 0.0, 1.0)):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ConfigError(f"stragglers.{name}", value, f"a probability in [{lo}, {hi}]")
        if not 1.0 <= self.low <= self.high:
            raise ConfigError("stragglers.low/high", (self.low, self.high),
                              "slowdown factors with 1 <= low <= high")
        if self.slow_factor < 1.0:
            raise ConfigError("stragglers.slow_factor", self.slow_factor, "a factor >= 1")

    def factors(self, seed: int, update: int, n_ranks: int) -> np.ndarray:
        """The compute-time factor of each of ``n_ranks`` ranks on update number ``update``
        (the update about to be made, counted from 0) of a run of ``seed``."""
        rng = np.random.default_rng([_TRANSIENT, int(seed), int(update)])
        hit = rng.random(n_ranks) < self.p
        slow = rng.uniform(self.low, self.high, n_ranks)
        factors = np.where(hit, slow, 1.0)
        if self.slow_fraction > 0 and self.slow_factor > 1:
            factors = factors * np.where(self.persistently_slow(seed, n_ranks),
                                         self.slow_factor, 1.0)
        return factors

    def persistently_slow(self, seed: int, n_ranks: int) -> np.ndarray:
        """Which of ranks 0 … n_ranks − 1 are slow on every update (each rank's own draw)."""
        return np.array([np.random.default_rng([_PERSISTENT, int(seed), r]).random()
                         < self.slow_fraction for r in range(n_ranks)], dtype=bool)

    def expected_slowest(self, n_ranks: int) -> float:
        """E[max of ``n_ranks`` transient factors] in closed form (module docstring); the
        persistently slow ranks are not in it."""
        p, q, w, n = self.p, 1.0 - self.p, self.high - self.low, int(n_ranks)
        if p == 0:
            return 1.0
        return 1 + (self.low - 1) * (1 - q**n) + w - w * (1 - q ** (n + 1)) / (p * (n + 1))


AWS_5PCT = Stragglers(p=0.05, low=2.0, high=3.0)
