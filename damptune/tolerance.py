"""How an update tolerates stragglers (the config's ``sync``).

* ``sync``: the update waits for every rank's gradient (its compute costs the slowest
  rank's time, :mod:`damptune.stragglers`).
* ``backup:B``: the update uses the first ``P − B`` gradients to arrive and drops the ``B``
  slowest (Chen et al. 2016, "Revisiting distributed synchronous SGD"): its batch is the
  examples that arrived, and its compute costs the ``(P − B)``-th arrival's time. At least one
  gradient is always kept. Ranks that arrive together are kept in rank order.
* ``ssp:S``: stale-synchronous parallel (Ho et al. 2013), in the parameter-server mode. Every
  update still sums one gradient from each rank, but a rank need not wait for the others: it
  starts its next gradient as soon as it finished its last, on the newest weights the master
  has applied, as long as that is at most ``S`` updates old. With ``T_i(t)`` the time rank ``i``
  finishes its gradient of update ``t``, ``U(t)`` the time the master applies update ``t``
  and ``c`` a share's compute::

      start_i(t) = max(T_i(t−1), U(t−S−1))       T_i(t) = start_i(t) + c · factor_i(t)
      U(t) = max_i T_i(t)                        staleness_i(t) = #{k < t : U(k) > start_i(t)}

  The update's compute costs ``U(t) − U(t−1)``, and rank ``i``'s gradient is computed on the
  weights of ``staleness_i(t)`` updates before the newest (:class:`SspClock`). A straggler's
  delay is then paid once, not once per update it holds up: the others compute ahead on
  slightly stale weights. With no stragglers every gradient is fresh; ``ssp:0`` is ``sync``.

The order of arrival is the simulated one: each rank's share costs the same compute, times
its straggler factor, so the factors alone order the ranks. ``backup:0`` is ``sync``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from damptune.errors import ConfigError

__all__ = ["Tolerance", "Arrival", "SspClock", "parse_sync", "arrival", "SYNC_ACCEPTED"]

SYNC_ACCEPTED = ("'sync', 'backup:B' (B >= 0: the B slowest ranks' gradients dropped) or "
                 "'ssp:S' (S >= 0: gradients at most S updates stale; mode centralized or local)")
_PATTERN = re.compile(r"^(backup|ssp):(\d+)$")


@dataclass(frozen=True)
class Tolerance:
    """``kind`` "sync", "backup" (``backup`` gradients dropped per update) or "ssp" (gradients
    at most ``staleness`` updates stale)."""

    kind: str = "sync"
    backup: int = 0
    staleness: int = 0


@dataclass(frozen=True)
class Arrival:
    """Which ranks' gradients enter an update, and the straggler factor it waited for."""

    kept: np.ndarray  # bool per rank
    straggle: float  # the factor of the last gradient the update waited for (>= 1)


def parse_sync(text: object) -> Tolerance:
    """``"sync"``, ``"backup:B"`` or ``"ssp:S"``; a :class:`ConfigError` naming ``sync``
    otherwise."""
    if text == "sync":
        return Tolerance()
    match = _PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError("sync", text, SYNC_ACCEPTED)
    kind, value = match.group(1), int(match.group(2))
    return Tolerance("backup", backup=value) if kind == "backup" else Tolerance(
        "ssp", staleness=value)


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


@dataclass
class SspClock:
    """The simulated clocks of ``ssp:S`` (module docstring), in seconds of compute: when each
    rank finished its last gradient, and when the master applied the last ``S + 1`` updates
    (oldest first). Kept in checkpoints: a resumed run goes on with the same clocks."""

    finish: list[float] = field(default_factory=list)
    applied: list[float] = field(default_factory=list)

    def step(self, factors: np.ndarray, compute: float, bound: int) -> tuple[float, list[int]]:
        """Advance by one update of ``len(factors)`` ranks whose shares take ``compute``
        seconds times their factor: (the update's compute seconds, each rank's staleness).
        Ranks added since the last update start when it was applied; removed ones are
        forgotten."""
        last = self.applied[-1] if self.applied else 0.0
        gate = self.applied[-(bound + 1)] if len(self.applied) > bound else 0.0
        n = len(factors)
        finish = self.finish[:n] + [last] * (n - len(self.finish))
        starts = [max(f, gate) for f in finish]
        recent = self.applied[len(self.applied) - bound:] if bound else []
        staleness = [sum(1 for u in recent if u > start) for start in starts]
        ends = [start + compute * float(f) for start, f in zip(starts, factors, strict=True)]
        now = max(ends)
        self.finish, self.applied = ends, (self.applied + [now])[-(bound + 1):]
        return now - last, staleness

    def state_dict(self) -> dict[str, list[float]]:
        return {"finish": list(self.finish), "applied": list(self.applied)}
