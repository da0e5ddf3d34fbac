"""The cell task: one Optuna study whose trials run as Prefect tasks submitted from here.

Trials go to a thread pool owned by this cell (not to the flow's runner), so a cell waiting on
its trials never starves them of threads, whatever the number of cells and trials.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import optuna
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from damptune import interrupt
from models import load_dataset
from tasks import tracking
from tasks.grid import Cell, GridSettings
from tasks.leases import leases_for
from tasks.search import (
    StorageUnavailable,
    count_finished,
    distributions,
    open_study,
    sampler_for,
    study_name,
    with_storage_retries,
)
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
        "n_running": sum(t.state == State.RUNNING for t in trials),
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
    study = with_storage_retries(lambda: open_study(grid, c, n_train=n_train))
    space = distributions(grid, c)

    client = tracking.client_for(grid.tracking_uri)
    exp_id = tracking.with_retries(lambda: tracking.experiment_id(
        client, grid_name=grid.grid_name, artifact_root=f"{grid.run_dir}/mlartifacts"),
        what="finding the grid's experiment")
    parent = tracking.with_retries(lambda: tracking.parent_run(client, exp_id, cell_key=c.key,
                                                               params={
        "network": c.network, "algorithm": c.algorithm, "model": c.model,
        "dataset": grid.dataset, "target_accuracy": grid.target_for(c.model),
        "profile": grid.profile, "mode": grid.mode, "trials": grid.trials,
        "epochs": grid.epochs, "seed": grid.seed, "sampler": grid.sampler,
        "pruner": grid.pruner, "study": study_name(grid, c),
    }), what="creating the cell's run")

    tracking.with_retries(lambda: client.update_run(parent, status="RUNNING"),
                          what="reopening the cell's run")
    leases = leases_for(grid.storage)
    owner = pool_key  # this flow run

    def lease(t: optuna.trial.FrozenTrial | optuna.Trial) -> str:
        return f"{study.study_name}#{t.number}"

    def held_elsewhere() -> int:
        return sum(leases.held_by_other(lease(t), owner)
                   for t in study.get_trials(deepcopy=False, states=(State.RUNNING,)))

    def run_batch(batch: list[tuple[int, int, dict[str, Any]]]) -> bool:
        """Train a batch of (number, trial id, params); False if the run was interrupted."""
        futures = [(number, trial_id, runner.submit(run_trial, {
            "settings": settings, "cell_key": c.key, "cell": cell, "number": number,
            "trial_id": trial_id, "params": params, "pool_key": pool_key,
            "experiment_id": exp_id, "parent_run_id": parent, "lease_key":
            f"{study.study_name}#{number}"}))
            for number, trial_id, params in batch]
        interrupted = False
        outages: list[tuple[str, str]] = []
        for number, _trial_id, future in futures:
            key = f"{study.study_name}#{number}"
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - recorded as a failed trial
                log.warning("trial %s of %s failed: %s", number, c.key, exc)
                with_storage_retries(lambda n=number: study.tell(n, state=State.FAIL))
                leases.release(key, owner)
                continue
            if result["state"] == "INTERRUPTED":  # not a failure: the next run resumes it
                log.warning("trial %s of %s interrupted: %s", number, c.key, result["reason"])
                if result.get("outage"):
                    outages.append((result["outage"], result["reason"]))
                with contextlib.suppress(Exception):  # else the lease expires after its TTL
                    leases.release(key, owner)
                interrupted = True
                continue
            if result["state"] == "PRUNED":
                with_storage_retries(lambda n=number: study.tell(n, state=State.PRUNED))
            else:
                with_storage_retries(lambda n=number, v=result["value"]: study.tell(n, v))
            leases.release(key, owner)
            log.info("%s trial %s: %s value=%.4g params=%s", c.key, number, result["state"],
                     result["value"], result["params"])
        if outages:  # a store stayed unreachable: stop the cell with its clear error
            kind, reason = outages[0]
            raise (StorageUnavailable if kind == "StorageUnavailable"
                   else tracking.TrackingUnavailable)(reason)
        return not interrupted

    with ThreadPoolTaskRunner(max_workers=max_concurrent_trials) as runner:
        while True:
            # 1. trials left RUNNING by an interrupted or dead run: resume them, same numbers
            stale = [t for t in study.get_trials(deepcopy=False, states=(State.RUNNING,))
                     if leases.acquire(lease(t), owner)]
            if stale:
                for i in range(0, len(stale), max_concurrent_trials):
                    chunk = stale[i:i + max_concurrent_trials]
                    if not run_batch([(t.number, t._trial_id, dict(t.params)) for t in chunk]):
                        return _finish(study, c, client, exp_id, parent, interrupted=True)
                continue
            # 2. new trials in deterministic batches: a batch is asked when the previous one is
            #    finished, each trial's sampler seeded by (grid seed, trial number)
            elsewhere = held_elsewhere()
            remaining = grid.trials - count_finished(study) - elsewhere
            if remaining > 0:
                batch = []
                for _ in range(min(max_concurrent_trials, remaining)):
                    study.sampler = sampler_for(grid, len(study.trials), study.study_name)
                    t = with_storage_retries(lambda: study.ask(space))
                    # between ask and acquire, another run may have seen the new trial RUNNING
                    # without a lease and taken it over (step 1): it is theirs to train
                    if leases.acquire(lease(t), owner):
                        batch.append((t.number, t._trial_id, dict(t.params)))
                if not run_batch(batch):
                    return _finish(study, c, client, exp_id, parent, interrupted=True)
                continue
            if elsewhere == 0:
                break
            # 3. another live run trains the rest: wait until it finishes them, or dies and
            #    its leases expire (then step 1 takes them over)
            if interrupt.requested():
                return _finish(study, c, client, exp_id, parent, interrupted=True)
            time.sleep(min(5.0, leases.ttl / 4))

    return _finish(study, c, client, exp_id, parent, interrupted=False)


def _finish(study: optuna.Study, c: Cell, client: Any, exp_id: str, parent: str, *,
            interrupted: bool) -> dict[str, Any]:
    """Tag the parent run with the best trial and the counts; return the cell's summary."""
    return tracking.with_retries(
        lambda: _tag_parent(study, c, client, exp_id, parent, interrupted=interrupted),
        what="tagging the cell's run")


def _tag_parent(study: optuna.Study, c: Cell, client: Any, exp_id: str, parent: str, *,
                interrupted: bool) -> dict[str, Any]:
    tracking.wait_plots([r.info.run_id for r in client.search_runs(
        [exp_id], f"tags.`damptune.cell` = '{c.key}' and tags.`damptune.kind` = 'trial'",
        max_results=1000)])
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
    client.set_terminated(parent, status="KILLED" if interrupted else "FINISHED")
    summary["parent_run_id"] = parent
    summary["interrupted"] = interrupted
    return summary
