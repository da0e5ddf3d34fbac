"""How an update tolerates stragglers (the config's ``sync``).

* ``sync``: the update waits for every rank's gradient (its compute costs the slowest
  rank's time, :mod:`damptune.stragglers`).
* ``backup:B``: the update uses the first ``P − B`` gradients to arrive and drops the ``B``
  slowest (Chen et al. 2016, "Revisiting distributed synchronous SGD"): its batch is the
  examples that arrived, and its compute costs the ``(P − B)``-th arrival's time. At least one
  gradient is always kept. Ranks that arrive together are kept in rank order.

The order of arrival is the simulated one: each rank's share costs the same compute, times
its straggler factor, so the factors alone order the ranks. ``backup:0`` is ``sync``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from damptune.errors import ConfigError

__all__ = ["Tolerance", "Arrival", "parse_sync", "arrival", "SYNC_ACCEPTED"]

SYNC_ACCEPTED = "'sync', or 'backup:B' (B >= 0: the B slowest ranks' gradients dropped)"
_BACKUP = re.compile(r"^backup:(\d+)$")


@dataclass(frozen=True)
class Tolerance:
    """``kind`` "sync" or "backup", with ``backup`` gradients dropped per update."""

    kind: str = "sync"
    backup: int = 0


@dataclass(frozen=True)
class Arrival:
    """Which ranks' gradients enter an update, and the straggler factor it waited for."""

    kept: np.ndarray  # bool per rank
    straggle: float  # the factor of the last gradient the update waited for (>= 1)


def parse_sync(text: object) -> Tolerance:
    """``"sync"`` or ``"backup:B"``; a :class:`ConfigError` naming ``sync`` otherwise."""
    if text == "sync":
        return Tolerance()
    match = _BACKUP.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError("sync", text, SYNC_ACCEPTED)
    return Tolerance("backup", int(match.group(1)))


def arrival(tolerance: Tolerance, factors: np.ndarray) -> Arrival:
    """The gradients an update of ``len(factors)`` ranks uses, given each rank's straggler
    factor (module docstring)."""
    n = len(factors)
    keep = max(1, n - tolerance.backup)
    if keep >= n:
        return Arrival(np.ones(n, dtype=bool), float(np.max(factors)) if n else 1.0)
    order = np.lexsort((np.arange(n), factors))  # by factor, then by rank
    kept = np.zeros(n, dtype=bool)
    kept[order[:keep]] = True
    return Arrival(kept, float(factors[order[keep - 1]]))
