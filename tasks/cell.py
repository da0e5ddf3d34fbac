"""The cell task: one Optuna study whose trials run as Prefect tasks submitted from here.

Trials go to a thread pool owned by this cell (not to the flow's runner), so a cell waiting on
its trials never starves them of threads, whatever the number of cells and trials.
"""

from __future__ import annotations

import logging
from typing import Any

import optuna
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from models import load_dataset
from tasks import tracking
from tasks.grid import Cell, GridSettings
from tasks.search import count_finished, distributions, open_study, study_name
from tasks.trial import run_trial

__all__ = ["run_cell", "summarize"]

State = optuna.trial.TrialState


def summarize(study: optuna.Study, cell: Cell) -> dict[str, Any]:
    """Best hyperparameters and value, and the trial counts of one cell."""
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == State.COMPLETE]
    best = min(complete, key=lambda t: t.value) if complete else None  # type: ignore[arg-type,return-value]
    return {
        "network": cell.network,
        "algorithm": cell.algorithm,
        "model": cell.model,
        "study": study.study_name,
        "best_params": dict(best.params) if best else {},
        "best_value": best.value if best else None,
        "best_trial": best.number if best else None,
        "n_complete": len(complete),
        "n_pruned": sum(t.state == State.PRUNED for t in trials),
        "n_failed": sum(t.state == State.FAIL for t in trials),
    }


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run context
        return logging.getLogger("damptune.tasks")


@task(name="cell", cache_policy=NO_CACHE, task_run_name="cell {cell_key}")
def run_cell(
    *,
    settings: dict[str, Any],
    cell_key: str,
    cell: dict[str, Any],
    pool_key: str,
    max_concurrent_trials: int = 1,
) -> dict[str, Any]:
    """Run the cell's study until it holds ``trials`` finished trials in all."""
    grid = GridSettings(**settings)
    c = Cell(**cell)
    log = _logger()
    n_train = len(load_dataset(grid.dataset, seed=grid.seed).y_train)
    study = open_study(grid, c, n_train=n_train)
    space = distributions(grid, c)

    client = tracking.client_for(grid.tracking_uri)
    exp_id = tracking.experiment_id(client, grid_name=grid.grid_name,
                                    artifact_root=f"{grid.run_dir}/mlartifacts")
    parent = tracking.parent_run(client, exp_id, cell_key=c.key, params={
        "network": c.network, "algorithm": c.algorithm, "model": c.model,
        "dataset": grid.dataset, "target_accuracy": grid.target_for(c.model),
        "profile": grid.profile, "mode": grid.mode, "trials": grid.trials,
        "epochs": grid.epochs, "seed": grid.seed, "sampler": grid.sampler,
        "pruner": grid.pruner, "study": study_name(grid, c),
    })

    client.update_run(parent, status="RUNNING")
    with ThreadPoolTaskRunner(max_workers=max_concurrent_trials) as runner:
        while (remaining := grid.trials - count_finished(study)) > 0:
            batch = [study.ask(space) for _ in range(min(max_concurrent_trials, remaining))]
            futures = [
                (t, runner.submit(run_trial, {
                    "settings": settings, "cell_key": c.key, "cell": cell, "number": t.number,
                    "trial_id": t._trial_id, "params": t.params, "pool_key": pool_key,
                    "experiment_id": exp_id, "parent_run_id": parent,
                }))
                for t in batch
            ]
            for t, future in futures:
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - recorded as a failed trial
                    log.warning("trial %s of %s failed: %s", t.number, c.key, exc)
                    study.tell(t, state=State.FAIL)
                    continue
                if result["state"] == "PRUNED":
                    study.tell(t, state=State.PRUNED)
                else:
                    study.tell(t, result["value"])
                log.info("%s trial %s: %s value=%.4g params=%s", c.key, t.number,
                         result["state"], result["value"], result["params"])

    summary = summarize(study, c)
    tags = {"damptune.n_complete": summary["n_complete"],
            "damptune.n_pruned": summary["n_pruned"], "damptune.n_failed": summary["n_failed"]}
    if summary["best_trial"] is not None:
        best_run = tracking.find_trial_run(client, exp_id, cell_key=c.key,
                                           number=summary["best_trial"])
        tags.update({"damptune.best_trial": summary["best_trial"],
                     "damptune.best_value": summary["best_value"],
                     "damptune.best_run_id": best_run or "",
                     "damptune.best_params": summary["best_params"]})
        client.log_metric(parent, "best_value", float(summary["best_value"]))
    tracking.set_tags(client, parent, tags)
    client.set_terminated(parent, status="FINISHED")
    summary["parent_run_id"] = parent
    return summary
