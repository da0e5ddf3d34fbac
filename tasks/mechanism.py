"""What a trial's schedule did on its way to the target: the mechanism behind a damped speedup.

Growing the batch reaches the target in about the same epochs as a fixed batch, but in fewer
model updates; on a data-parallel cluster whose ranks grow with the batch, an update takes
about as long whatever its batch, so fewer updates are less wall-clock time. Every COMPLETE
trial records the numbers that show it, as its Optuna user attribute :data:`MECHANISM_ATTR`
(a JSON-able dict, :func:`mechanism`); the answer compares them seed by seed with the
baseline's (:func:`tasks.stats.compare_pair`).

Example:
    >>> history = [
    ...     {"kind": "update", "update": 1, "epoch": 0.5, "examples_seen": 32,
    ...      "batch_size": 32, "n_workers": 1, "damper_examples": 0},
    ...     {"kind": "update", "update": 2, "epoch": 1.5, "examples_seen": 96,
    ...      "batch_size": 64, "n_workers": 2, "damper_examples": 0},
    ...     {"kind": "eval", "update": 2, "epoch": 1.5, "examples_seen": 96,
    ...      "test_accuracy": 0.9, "time_elapsed": 0.1, "time_sim": 0.1}]
    >>> config = TrainConfig(module="models:MLP", compute_per_example=1e-3, n_train=64,
    ...                      max_workers=2)
    >>> m = mechanism(history, target=0.8, config=config, n_params=1000)
    >>> m["updates"], m["epochs"], m["mean_batch"], m["max_ranks"]
    (2, 1.5, 48.0, 2)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from damptune import TrainConfig
from damptune.netmodel import CostModel
from tasks.answer import profile_costs, progress_to_target

__all__ = ["MECHANISM_ATTR", "mechanism", "compute_comm_ratio"]

MECHANISM_ATTR = "mechanism"


def mechanism(history: list[dict[str, Any]], *, target: float, config: TrainConfig,
              n_params: int) -> dict[str, Any]:
    """The mechanism of a finished run (its engine ``history``, its resolved ``config`` with
    the compute calibration, its model's ``n_params``) towards ``target`` (test accuracy).

    Keys: ``updates`` (model updates), ``epochs`` (passes over the training set) and
    ``examples`` (examples seen) at the first evaluation that reached ``target`` (None when
    none did); ``mean_batch`` (examples per update up to there, or over the whole run when the
    target was not reached; None without updates); ``max_ranks`` (the most ranks, ``P``, any
    update used); ``profile`` (the profile the run was simulated on); ``profiles`` ({profile:
    simulated seconds to the target}: every named profile and the run's own, None when not
    reached), and ``compute_comm`` ({profile: :func:`compute_comm_ratio` at the run's
    ``max_workers`` ranks}). Under 10 ms for a history of 2,000 distinct updates.
    """
    progress = progress_to_target(history, target=target)
    reached = progress["reached"]
    updates = [r for r in history if r.get("kind") == "update"]
    upto = ([r for r in updates if int(r["update"]) <= progress["updates_to_target"]]
            if reached else [])
    if reached:
        n, examples = progress["updates_to_target"], progress["examples_to_target"]
    elif updates:
        n, examples = int(updates[-1]["update"]), int(updates[-1]["examples_seen"])
    else:
        n, examples = 0, 0
    costs = profile_costs(config, n_params)
    costs.setdefault(str(config.profile), config.cost_model(n_params))
    norm = bool(config.make_damper().uses_grad_norm)
    seconds = (_seconds_by_profile(upto, costs, norm=norm) if reached
               else dict.fromkeys(costs))
    return {"updates": progress["updates_to_target"],
            "epochs": progress["epochs_to_target"],
            "examples": progress["examples_to_target"],
            "mean_batch": examples / n if n else None,
            "max_ranks": max((int(r["n_workers"]) for r in updates), default=None),
            "profile": str(config.profile),
            "profiles": seconds,
            "compute_comm": {name: compute_comm_ratio(cost, n_ranks=config.max_workers,
                                                      per_rank_batch=config.per_worker_batch)
                             for name, cost in costs.items()}}


def compute_comm_ratio(cost: CostModel, *, n_ranks: int, per_rank_batch: int) -> float | None:
    """A cluster's compute : communication ratio (dimensionless): the seconds one rank spends
    computing its share of an update (``per_rank_batch`` examples, forward and backward, the
    calibrated ``compute_fixed + n · compute_per_example``) over the seconds the update's
    gradients take to travel among ``n_ranks`` ranks on the cost model's network
    (:meth:`~damptune.netmodel.CostModel.comm_seconds`: the all-reduce, or the parameter
    server's fan-out and fan-in). The orchestration overhead is in neither. Above 1, an update
    is mostly compute; below 1, mostly communication. None where nothing travels (one rank of
    an all-reduce)."""
    comm = cost.comm_seconds(n_ranks)
    if comm <= 0:
        return None
    return cost.compute_seconds(per_rank_batch * n_ranks, n_ranks) / comm


def _seconds_by_profile(updates: list[dict[str, Any]], costs: dict[str, CostModel], *,
                        norm: bool) -> dict[str, float]:
    """The simulated seconds of ``updates`` (update records) on each cost model: the sum of
    :meth:`~damptune.netmodel.CostModel.update_seconds` over them, as
    :func:`~damptune.netmodel.simulated_times` adds it, called once per distinct (batch,
    ranks, damper pass, straggler factor waited for) and weighted by how many updates had it."""
    kinds = Counter((int(r["batch_size"]), int(r["n_workers"]), int(r.get("damper_examples", 0)),
                     float(r.get("straggle", 1.0))) for r in updates)
    return {name: sum(count * cost.update_seconds(batch_size=b, n_ranks=p, damper_examples=e,
                                                  norm=norm, straggle=f)
                      for (b, p, e, f), count in kinds.items())
            for name, cost in costs.items()}
