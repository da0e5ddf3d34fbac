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

**The budget objective** (grid option ``objective="budget"``; the AdaDamp paper's, issue 24):
the trial trains its whole budget (``epochs``; the engine no longer stops at the target) and
its value is the simulated time of that budget, subject to the *final accuracy* reaching the
target: the moving average of test accuracy over the last :data:`FINAL_WINDOW` epoch of
examples seen (:func:`window_means`, weighted by examples). A miss is that time scaled up by the
relative shortfall of the final accuracy, as above, and its constraint is target − final
accuracy (:func:`outcome`). A schedule that does not adapt to the training takes the same
simulated time on every seed, so the seed's noise moves from the value to the constraint.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.choices import OBJECTIVES

__all__ = ["objective", "value_so_far", "first_change_epoch", "SCHEDULE_ATTR", "OBJECTIVES",
           "FINAL_WINDOW", "VALUE_NAMES", "objective_of", "value_name", "Outcome", "outcome",
           "judge", "window_means", "final_accuracy"]

# epochs of examples seen over which the budget objective averages the final test accuracy
FINAL_WINDOW = 0.5
# what a value is, by objective (the report's and figures' words; "target" for a grid from
# before the option)
VALUE_NAMES = {"target": "simulated time to the target",
               "budget": "simulated time of the epoch budget"}


def objective_of(row: dict[str, Any]) -> str:
    """The objective of a report row's values (its ``objective``; none: ``"target"``, a grid
    from before the option)."""
    return str(row.get("objective") or "target")


def value_name(rows: list[dict[str, Any]]) -> str:
    """What a report's values are (:data:`VALUE_NAMES`), by its rows' objective (the first
    row's, :func:`objective_of`)."""
    return VALUE_NAMES[objective_of(rows[0]) if rows else "target"]

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


@dataclass(frozen=True)
class Outcome:
    """A finished trial's result: its value, whether it met the target, its best test
    accuracy, and its constraint (target − the accuracy the objective reads; 0 when met)."""

    value: float
    reached: bool
    best_accuracy: float
    shortfall: float


def outcome(history: list[dict[str, Any]], *, target: float, kind: str = "target",
            window: float = 0.0) -> Outcome:
    """The outcome of a finished trial by the objective ``kind`` (:data:`OBJECTIVES`);
    ``window``: :data:`FINAL_WINDOW` in examples seen (the budget objective's average)."""
    if kind == "target":
        value, reached, best = objective(history, target=target)
        return Outcome(value, reached, best, 0.0 if reached else target - best)
    evals = [r for r in history if r["kind"] == "eval"]
    best = max((float(r["test_accuracy"]) for r in evals), default=0.0)
    final = final_accuracy(evals, window)
    end = float(history[-1]["time_sim"]) if history else 0.0
    if final >= target:
        return Outcome(end, True, best, 0.0)
    return Outcome(value_so_far(end, best_accuracy=final, target=target), False, best,
                   target - final)


def judge(*, target: float, kind: str, n_train: int) -> Callable[..., Outcome]:
    """:func:`outcome` of a finished history of a run on ``n_train`` training examples, by the
    objective ``kind``: the budget objective averages over :data:`FINAL_WINDOW` of its epochs."""
    return functools.partial(outcome, target=target, kind=kind, window=FINAL_WINDOW * n_train)


def final_accuracy(evals: list[dict[str, Any]], window: float) -> float:
    """The moving average of test accuracy at the last evaluation (0 without any)."""
    if not evals:
        return 0.0
    xs, ys = _series(evals, "test_accuracy")
    return _window_mean(xs, ys, len(xs) - 1, window)


def window_means(evals: list[dict[str, Any]], key: str, window: float) -> list[float]:
    """At each evaluation, the mean of ``key`` over the last ``window`` examples seen, weighted
    by examples (trapezoid rule between evaluations; a shorter window at the start)."""
    xs, ys = _series(evals, key)
    return [_window_mean(xs, ys, i, window) for i in range(len(xs))]


def _series(evals: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    return [float(r["examples_seen"]) for r in evals], [float(r[key]) for r in evals]


def _window_mean(xs: list[float], ys: list[float], i: int, window: float) -> float:
    """The mean of ``ys`` over examples seen in ``(xs[i] − window, xs[i]]``."""
    x = xs[i]
    lo, area, j = max(x - window, xs[0]), 0.0, i
    while j > 0 and xs[j - 1] >= lo:
        area += (xs[j] - xs[j - 1]) * (ys[j] + ys[j - 1]) / 2
        j -= 1
    if j > 0 and xs[j] > lo:  # the part of the segment (xs[j-1], xs[j]) inside the window
        y_lo = ys[j - 1] + (ys[j] - ys[j - 1]) * (lo - xs[j - 1]) / (xs[j] - xs[j - 1])
        area += (xs[j] - lo) * (ys[j] + y_lo) / 2
    return area / (x - lo) if x > lo else ys[i]
