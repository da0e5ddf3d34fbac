"""The trial's objective (minimized): simulated wall-clock until the target test accuracy.

The value is the simulated time, on the grid's network profile, at the first evaluation whose
test accuracy reaches the model's target (the engine stops training there, so the value cannot
change any more). Evaluations come every ``eval_resolution`` (2 %) of growth in examples seen
as well as every ``eval_every`` epochs, so the value is at most that fraction after the first
update that reached the target (tested against an evaluation after every update). Evaluation
is measurement: it is charged to neither clock.

A trial that never reaches the target within its epochs gets
``T_end × (1 + (target − best_accuracy) / target)``: the simulated time it spent, scaled up by
how far it fell short. Its cell records it with the Optuna constraint ``target_shortfall``
(target − best accuracy > 0: infeasible), so any trial that reached the target beats it,
whatever the two values (:func:`tasks.search.best_trial`); among trials that all missed, the
value orders them. The same formula, applied to a trial still running, is its value if it
stopped now (:func:`value_so_far`): what the multi-fidelity pruners compare.
"""

from __future__ import annotations

from typing import Any

__all__ = ["objective", "value_so_far", "first_change_epoch", "SCHEDULE_ATTR"]

# Optuna user attribute of a COMPLETE trial: the epoch its schedule first changed the batch size
# or the learning rate (None: it trained at its first update's until it stopped)
SCHEDULE_ATTR = "schedule_changed_epoch"


def value_so_far(time_sim: float, *, best_accuracy: float, target: float) -> float:
    """The objective of a trial stopped now, after ``time_sim`` simulated seconds with the best
    test accuracy ``best_accuracy`` so far: ``time_sim`` if it reached the target, else scaled
    up by its shortfall."""
    if best_accuracy >= target:
        return float(time_sim)
    return float(time_sim) * (1 + (target - best_accuracy) / target)


def first_change_epoch(history: list[dict[str, Any]]) -> float | None:
    """The epoch of the first update whose batch size or learning rate differs from the first
    update's; None when none did. A trial that stopped at its target with None reached it
    before its schedule acted: it trained as plain SGD at its first batch size and rate."""
    updates = (r for r in history if r["kind"] == "update")
    first = next(updates, None)
    if first is None:
        return None
    return next((float(r["epoch"]) for r in updates
                 if r["batch_size"] != first["batch_size"] or r["lr"] != first["lr"]), None)


def objective(history: list[dict[str, Any]], *, target: float) -> tuple[float, bool, float]:
    """(value, reached, best accuracy) of a finished trial's history (plain-dict records)."""
    evals = [r for r in history if r["kind"] == "eval"]
    best = max((r["test_accuracy"] for r in evals), default=0.0)
    for r in evals:
        if r["test_accuracy"] >= target:
            return float(r["time_sim"]), True, best
    end = float(history[-1]["time_sim"]) if history else 0.0
    return value_so_far(end, best_accuracy=best, target=target), False, best
