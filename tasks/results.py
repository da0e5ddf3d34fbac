"""What a trial ends as: a state (an enum, never a string compared) and its outcome."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrialState", "TrialResult"]


class TrialState(enum.Enum):
    """How a trial ended. INTERRUPTED is not a failure: a rerun continues the trial."""

    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    INTERRUPTED = "INTERRUPTED"
    FAIL = "FAIL"


@dataclass(frozen=True)
class TrialResult:
    """One trial's outcome, as its cell records it in Optuna.

    ``value`` is the objective (simulated seconds to the target, see :mod:`tasks.objective`);
    ``outage`` is the exception of a store that stayed unreachable (the trial is then
    INTERRUPTED and its cell stops with that error); ``fault`` is the fault of the cluster
    that interrupted it (a lost worker, a rank timeout: its run retries it).
    """

    number: int
    state: TrialState
    params: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    run_id: str | None = None
    reason: str = ""
    outage: Exception | None = None
    fault: BaseException | None = None
    reached: bool = False
    best_accuracy: float | None = None
    shortfall: float = 0.0  # target − best accuracy (0 when reached): Optuna's constraint
    examples_seen: int | None = None  # where it stopped (a pruned trial's last report)
    # Optuna user attributes its cell sets with a COMPLETE result (tasks.reuse.TRAINING_ATTR)
    user_attrs: dict[str, Any] = field(default_factory=dict)
