"""The cost model's ceiling: the most any damped schedule could win over the fixed-batch baseline.

A schedule that starts at the baseline's batch ``B0`` on one rank and grows to the cap
``P × per_worker_batch`` on ``P`` ranks can only speed up the part of training after its
first growth, and by at most the per-epoch speedup at the cap::

    s        = epoch time at B0 on one rank / epoch time at the cap on P ranks
    φ        = share of the baseline's time to target (or of its epoch budget, when that
               is what is timed) after the earliest growth of any configuration that
               still reaches the target
    ceiling  = 1 / ((1 − φ) + φ / s)                                    (Amdahl's law)

A grid whose measured speedups sit far below its ceiling leaves room to the search; a grid
whose ceiling is near 1 cannot show damping at all, whatever the search does (the cost model,
not the algorithms, decides). ``s`` depends only on the network profile, the compute
calibration and the model size; ``φ`` on when training reaches the target.

Example:
    >>> from damptune.netmodel import CostModel, Network
    >>> cost = CostModel(network=Network("ideal", 100.0, 0.0), n_params=0,
    ...                  compute_per_example=1e-3)
    >>> round(epoch_speedup(cost, examples=4000, initial_batch=32, per_worker_batch=32,
    ...                     n_ranks=16), 2)
    15.62
    >>> round(ceiling(s=16.0, phi=0.75), 2)
    3.37
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from damptune.errors import ConfigError
from damptune.netmodel import CostModel, simulated_times, time_to_target

__all__ = ["epoch_seconds", "epoch_speedup", "first_growth", "growth_share", "ceiling"]


def epoch_seconds(cost: CostModel, *, batch_size: int, n_ranks: int, examples: int) -> float:
    """Simulated seconds of one epoch of ``examples`` at ``batch_size`` on ``n_ranks``."""
    return math.ceil(examples / batch_size) * cost.update_seconds(batch_size=batch_size,
                                                                   n_ranks=n_ranks)


def epoch_speedup(cost: CostModel, *, examples: int, initial_batch: int, per_worker_batch: int,
                  n_ranks: int) -> float:
    """``s``: an epoch at ``initial_batch`` (on the ranks it fills, at least one) over an epoch
    at the cap ``n_ranks × per_worker_batch`` on ``n_ranks`` ranks."""
    if examples <= 0 or initial_batch <= 0 or per_worker_batch <= 0 or n_ranks <= 0:
        raise ConfigError("examples/initial_batch/per_worker_batch/n_ranks",
                          (examples, initial_batch, per_worker_batch, n_ranks),
                          "positive integers")
    base = epoch_seconds(cost, batch_size=initial_batch, examples=examples,
                         n_ranks=max(1, initial_batch // per_worker_batch))
    cap = n_ranks * per_worker_batch
    return base / epoch_seconds(cost, batch_size=cap, n_ranks=n_ranks, examples=examples)


def first_growth(history: Iterable[dict[str, Any]], *, initial_batch: int) -> int | None:
    """Examples seen before the first update whose batch exceeds ``initial_batch`` (None: the
    batch never grew past it)."""
    for record in history:
        if record.get("kind", "update") == "update" and int(record["batch_size"]) > initial_batch:
            return int(record["examples_seen"]) - int(record["batch_size"])
    return None


def first_damping(history: Iterable[dict[str, Any]], *, initial_batch: int) -> int | None:
    """Examples seen before the first update whose damping exceeds ``initial_batch`` (None:
    it never did). On a run whose cap is B0 (a learning-rate decay) this is where its decay
    begins: where a damper that grows the batch by the same factor could first grow it."""
    for record in history:
        if (record.get("kind", "update") == "update"
                and float(record.get("damping", record["batch_size"])) > initial_batch):
            return int(record["examples_seen"]) - int(record["batch_size"])
    return None


def growth_share(baseline: list[dict[str, Any]], cost: CostModel, *, target: float | None,
                 growth_examples: int) -> float | None:
    """``φ``: the share of the baseline's simulated time to ``target`` spent after it had
    seen ``growth_examples`` examples (None: the baseline never reached the target). With
    ``target`` None, the share of its whole history's time: a run timed on a fixed budget."""
    times = simulated_times(baseline, cost)
    if target is None:
        total = times[-1] if times else 0.0
    else:
        reached = time_to_target(baseline, cost, target=target)
        total = reached.simulated_seconds if reached.reached else 0.0
    if total <= 0:
        return None
    before = 0.0
    for record, t in zip(baseline, times, strict=True):
        if record.get("kind", "update") == "update":
            if int(record["examples_seen"]) > growth_examples:
                break
            before = t
    return max(0.0, 1.0 - before / total)


def ceiling(*, s: float, phi: float) -> float:
    """Amdahl's bound ``1 / ((1 − φ) + φ / s)`` on a damped schedule's speedup."""
    if s <= 0 or not 0 <= phi <= 1:
        raise ConfigError("s/phi", (s, phi), "s > 0 and phi in [0, 1]")
    return 1.0 / ((1.0 - phi) + phi / s)
