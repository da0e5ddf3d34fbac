"""The trial's objective (minimized): simulated wall-clock until the target test accuracy.

The value is the simulated time, on the grid's network profile, at the first evaluation whose
test accuracy reaches the model's target; the trial stops there (its value cannot change any
more). A trial that never reaches it within its epochs gets
``T_end × (1 + (target − best_accuracy) / target)``: the simulated time it spent, scaled up by
how far it fell short — always more than it spent, so it ranks behind any trial that reached the
target in the same time.
"""

from __future__ import annotations

from typing import Any

__all__ = ["objective"]


def objective(history: list[dict[str, Any]], *, target: float) -> tuple[float, bool, float]:
    """(value, reached, best accuracy) of a finished trial's history (plain-dict records)."""
    evals = [r for r in history if r["kind"] == "eval"]
    best = max((r["test_accuracy"] for r in evals), default=0.0)
    for r in evals:
        if r["test_accuracy"] >= target:
            return float(r["time_sim"]), True, best
    end = float(history[-1]["time_sim"]) if history else 0.0
    return end * (1 + (target - best) / target), False, best
