"""What one change of P costs a distributed run, in units of one update (a helper of
``step_time.py``, not a bench).

A change of P happens on the ranks (:func:`damptune.ranks._control`): rank 0 broadcasts the
new P and its state to every rank, the ranks that start training restore it, and all switch
subgroups. Its cost is rank 0's time in that step (``damptune.ranks.RESIZE_SECONDS``, read
from the workers), plus what the first update after it took beyond a typical update at the new
P (there rank 0 waits for the ranks that were still restoring).
"""

from __future__ import annotations

import statistics
from typing import Any


def clear(client: Any) -> None:
    client.run(_clear)


def _clear() -> None:
    from damptune.ranks import RESIZE_SECONDS

    RESIZE_SECONDS.clear()


def _read() -> list[float]:
    from damptune.ranks import RESIZE_SECONDS

    return list(RESIZE_SECONDS)


def control_seconds(client: Any) -> list[float]:
    """Rank 0's seconds per change of P since ``clear`` (one worker holds them)."""
    found = [v for v in client.run(_read).values() if v]
    return found[0] if found else []


def change_costs(history: list[dict[str, Any]], control: list[float]) -> list[float]:
    """Each change of P in the run's history, in units of the median update at the new P."""
    updates = [r for r in history if r["kind"] == "update"]
    firsts = [i for i in range(1, len(updates))
              if updates[i]["n_workers"] != updates[i - 1]["n_workers"]]
    costs = []
    for seconds, i in zip(control, firsts, strict=False):
        later = [r["time_update"] for r in updates[i + 1:]
                 if r["n_workers"] == updates[i]["n_workers"]]
        typical = statistics.median(later) if later else updates[i]["time_update"]
        extra = max(0.0, updates[i]["time_update"] - typical)
        costs.append((seconds + extra) / typical)
    return costs
