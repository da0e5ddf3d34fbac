"""The engine's own orchestration overhead per update, measured: a fixed part plus a part per
rank, the two terms of a network profile's ``overhead`` (:mod:`damptune.netmodel`).

An update's overhead is its measured time beyond the computation of its slowest rank:
``time_update − time_compute − time_damper`` — the exchange of gradients or weights between
processes, the optimizer step, drawing the batch, the flag and the loss travelling with the
gradients. Its median at each number of ranks P, fitted by least squares to
``fixed + per_rank · P``, is what a run of this mode costs on this cluster per update besides
computing. :func:`overhead_of` fits it from any run's history (free: the ranks grow with the
batch within a trial); :func:`measure_overhead` runs short fixed trials at chosen P
(``damptune overhead`` on the command line). Pass the result to ``damptune simulate
--overhead-ms/--overhead-per-rank-ms`` or the flow's ``overhead_ms``/``overhead_per_rank_ms`` to
simulate your own cluster instead of the AdaDamp paper's defaults (16 ms + 3.3 ms × P).

Example:
    >>> history = [{"kind": "update", "n_workers": p, "time_update": 0.010 + 0.002 * p,
    ...             "time_compute": 0.001, "time_damper": 0.0} for p in (1, 2, 4)]
    >>> fit = overhead_of(history)
    >>> round(fit.fixed * 1e3, 3), round(fit.per_rank * 1e3, 3)
    (9.0, 2.0)
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Overhead", "overhead_of", "fit_overhead", "measure_overhead"]


@dataclass(frozen=True)
class Overhead:
    """Seconds of orchestration per update: ``fixed + per_rank · P``, fitted to ``points``
    (P, median seconds)."""

    fixed: float
    per_rank: float
    points: tuple[tuple[int, float], ...] = ()

    def seconds(self, n_ranks: int) -> float:
        return self.fixed + self.per_rank * n_ranks

    def as_dict(self) -> dict[str, Any]:
        return {"overhead_ms": self.fixed * 1e3, "overhead_per_rank_ms": self.per_rank * 1e3,
                "points": [{"ranks": p, "ms": s * 1e3} for p, s in self.points]}


def _extra(record: dict[str, Any]) -> float:
    return max(0.0, float(record["time_update"]) - float(record.get("time_compute", 0.0))
               - float(record.get("time_damper", 0.0)))


def overhead_of(history: Iterable[dict[str, Any]], *, skip_first: int = 1) -> Overhead | None:
    """Fit the overhead from a run's update records (the first ``skip_first`` updates at each
    P are left out: they pay for the change of P). None without update records."""
    by_ranks: dict[int, list[float]] = {}
    seen: dict[int, int] = {}
    for record in history:
        if record.get("kind") != "update":
            continue
        p = int(record["n_workers"])
        seen[p] = seen.get(p, 0) + 1
        if seen[p] > skip_first or skip_first == 0:
            by_ranks.setdefault(p, []).append(_extra(record))
    if not by_ranks:
        return None
    return fit_overhead([(p, statistics.median(v)) for p, v in sorted(by_ranks.items())])


def fit_overhead(points: Sequence[tuple[int, float]]) -> Overhead:
    """Least-squares ``fixed + per_rank · P`` through (P, seconds) points; with one P the
    per-rank part is 0. Neither part is negative."""
    if len({p for p, _ in points}) < 2:
        return Overhead(max(0.0, statistics.mean(s for _, s in points)), 0.0, tuple(points))
    xs, ys = [float(p) for p, _ in points], [s for _, s in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    slope = max(0.0, slope)
    return Overhead(max(0.0, my - slope * mx), slope, tuple(points))


def measure_overhead(config: Any, data: Any, *, ranks: Sequence[int], updates: int = 40,
                     cluster: Any = None) -> Overhead:
    """Run ``updates`` updates of plain SGD at each P in ``ranks`` (``P × per_worker_batch``
    examples per update, the run's mode, model and data) and fit the overhead."""
    from damptune.trainer import train

    points = []
    for p in ranks:
        batch = p * config.per_worker_batch
        run = dataclasses.replace(
            config, damper="sgd", damper_kwargs={"initial": batch}, max_batch_size=batch,
            min_workers=p, max_workers=p, max_updates=updates + 5, max_epochs=1e9,
            eval_every=1e9, eval_resolution=0.0, target_accuracy=None, max_time_sim=None,
            checkpoint_every=None, checkpoint_seconds=None)
        state = train(run, data, cluster=cluster)
        fit = overhead_of(state.history, skip_first=5)
        assert fit is not None and fit.points
        points.append((p, fit.points[0][1]))
    return fit_overhead(points)
