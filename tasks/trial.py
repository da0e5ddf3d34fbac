"""The trial task: train one damping configuration on its cell's ranks; report and log it.

Objective (minimized): the simulated wall-clock, on the grid's network profile, until the
first evaluation whose test accuracy reaches the model's target accuracy; the trial stops
there (its value cannot change any more). A trial that never reaches it within its epochs
gets ``T_end × (1 + (target − best_accuracy) / target)``: the simulated time it spent, scaled up
by how far it fell short — always more than it spent, so it ranks behind any trial that reached
the target in the same time. Intermediate values for the pruner are test errors (1 − accuracy)
at steps measured in examples seen.
"""

from __future__ import annotations

import os
from typing import Any

import optuna
from prefect import task
from prefect.cache_policies import NO_CACHE

from damptune import ClusterError, StopTraining, TrainConfig, TrainData, train
from damptune.config import import_path
from models import load_dataset, model_class
from tasks import tracking
from tasks.clusters import pool_for
from tasks.grid import Cell, GridSettings
from tasks.leases import Heartbeat, leases_for
from tasks.search import StorageUnavailable, open_study, with_storage_retries
from tasks.worklog import WorkLog

__all__ = ["run_trial", "objective", "trial_config"]

TARGET_REACHED = "the target accuracy was reached"
CALIBRATION_ATTR = "compute_calibration"  # [fixed s, s per example] of one rank
OUTAGES = (StorageUnavailable, tracking.TrackingUnavailable)
UPDATE_METRICS = ("loss", "batch_size", "lr", "damping", "n_workers", "examples_seen",
                  "time_elapsed", "time_sim", "time_compute", "time_comm")


def objective(history: list[dict[str, Any]], *, target: float) -> tuple[float, bool, float]:
    """(value, reached, best accuracy) of a finished trial (see module docstring)."""
    evals = [r for r in history if r["kind"] == "eval"]
    best = max((r["test_accuracy"] for r in evals), default=0.0)
    for r in evals:
        if r["test_accuracy"] >= target:
            return float(r["time_sim"]), True, best
    end = float(history[-1]["time_sim"]) if history else 0.0
    return end * (1 + (target - best) / target), False, best


def trial_config(settings: GridSettings, cell: Cell, params: dict[str, Any],
                 dataset: Any) -> TrainConfig:
    """The engine configuration of one trial."""
    damper_kwargs = {"initial": settings.initial_batch}
    damper_kwargs.update({k: v for k, v in params.items() if k != "lr"})
    damper_kwargs["initial"] = min(int(damper_kwargs["initial"]),
                                   cell.network * settings.per_worker_batch)
    return TrainConfig(
        module=import_path(model_class(cell.model)),
        module_kwargs={"input_shape": tuple(dataset.input_shape),
                       "n_classes": int(dataset.n_classes)},
        optimizer_kwargs={"momentum": settings.momentum},
        lr=float(params.get("lr", settings.lr)),
        damper=cell.algorithm,
        damper_kwargs=damper_kwargs,
        max_batch_size=cell.network * settings.per_worker_batch,
        per_worker_batch=settings.per_worker_batch,
        min_workers=1,
        max_workers=cell.network,
        max_epochs=settings.epochs,
        eval_every=settings.eval_every,
        seed=settings.seed,
        mode=settings.mode,
        profile=settings.profile,
        checkpoint_every=settings.checkpoint_every or None,
        checkpoint_seconds=settings.checkpoint_seconds or None,
        timeout=float(settings.extra.get("rank_timeout", 300.0)),
    )


@task(name="trial", cache_policy=NO_CACHE, task_run_name="{cell_key}/trial-{number}")
def run_trial(
    *,
    settings: dict[str, Any],
    cell_key: str,
    cell: dict[str, Any],
    number: int,
    trial_id: int,
    params: dict[str, Any],
    pool_key: str,
    experiment_id: str,
    parent_run_id: str,
    lease_key: str = "",
) -> dict[str, Any]:
    """Train trial ``number`` of the cell (continuing its checkpoint if there is one); return
    its state (COMPLETE, PRUNED or INTERRUPTED), value and MLflow run id.

    When the Optuna storage or MLflow stays unreachable through the retries, the trial is
    INTERRUPTED with ``outage`` set (not failed): its checkpoint, Optuna trial and MLflow run
    are left as they are, and a rerun continues it.
    """
    try:
        return _train_trial(settings=settings, cell_key=cell_key, cell=cell, number=number,
                            trial_id=trial_id, params=params, pool_key=pool_key,
                            experiment_id=experiment_id, parent_run_id=parent_run_id,
                            lease_key=lease_key)
    except OUTAGES as exc:
        return {"number": number, "state": "INTERRUPTED", "reason": str(exc),
                "outage": type(exc).__name__, "value": None, "run_id": None, "params": params}


def _train_trial(*, settings: dict[str, Any], cell_key: str, cell: dict[str, Any], number: int,
                 trial_id: int, params: dict[str, Any], pool_key: str, experiment_id: str,
                 parent_run_id: str, lease_key: str) -> dict[str, Any]:
    grid = GridSettings(**settings)
    c = Cell(**cell)
    target = grid.target_for(c.model)
    ds = load_dataset(grid.dataset, seed=grid.seed)
    config = trial_config(grid, c, params, ds)
    study = open_study(grid, c, n_train=len(ds.y_train))
    trial = optuna.trial.Trial(study, trial_id)

    client = tracking.client_for(grid.tracking_uri)
    run_id = tracking.with_retries(lambda: tracking.child_run(
        client, experiment_id, parent_id=parent_run_id, cell_key=cell_key, number=number,
        params={"algorithm": c.algorithm, "network": c.network, "model": c.model,
                "dataset": grid.dataset, "seed": grid.seed, "mode": grid.mode,
                "profile": grid.profile, "target_accuracy": target,
                "epochs": grid.epochs, **{f"hp.{k}": v for k, v in params.items()}},
    ), what="creating the trial's run")
    tracking.with_retries(lambda: client.update_run(run_id, status="RUNNING"),
                          what="reopening the run")  # a resumed trial continues its run
    metrics = tracking.MetricBuffer(client, run_id)
    last = {"batch_size": None, "n_workers": None}

    # one compute calibration per study, kept in it: a rerun on another machine (a spot
    # replacement) simulates the cell's remaining trials with the same numbers as the first
    calibration = with_storage_retries(lambda: study.user_attrs.get(CALIBRATION_ATTR))
    if calibration:
        config.compute_fixed, config.compute_per_example = map(float, calibration)
    worklog = WorkLog(grid.run_dir, cell_key, number)

    def on_record(record: dict[str, Any]) -> None:
        nonlocal calibration
        if not calibration:  # train() has calibrated (or taken the checkpoint's) by now
            calibration = [config.compute_fixed, config.compute_per_example]
            with_storage_retries(lambda: study.set_user_attr(CALIBRATION_ATTR, calibration))
        started = worklog.record(record)
        if started is not None and started["attempt"] > 1:  # what this attempt redoes
            metrics.add({"attempt": started["attempt"], "lost_updates": started["lost_updates"],
                         "lost_seconds": started["lost_seconds"]}, step=started["resumed_at"])
        if record["kind"] == "resume":
            return
        if record["kind"] == "update":
            changed = any(record[k] != v for k, v in last.items())
            if changed or record["update"] % grid.metrics_every == 0:
                metrics.add({k: record[k] for k in UPDATE_METRICS}, step=record["update"])
                last.update({k: record[k] for k in last})
            return
        metrics.add({"test_accuracy": record["test_accuracy"], "test_loss": record["test_loss"],
                     "eval_time_sim": record["time_sim"]}, step=record["update"])
        metrics.flush()
        if record["test_accuracy"] >= target:
            raise StopTraining(TARGET_REACHED)
        with_storage_retries(lambda: trial.report(1.0 - record["test_accuracy"],
                                                  step=int(record["examples_seen"])))
        if with_storage_retries(trial.should_prune):
            raise StopTraining(f"pruned by Optuna at {record['examples_seen']} examples")

    def terminate(status: str) -> None:
        tracking.with_retries(lambda: client.set_terminated(run_id, status=status),
                              what=f"ending the trial's run ({status})")

    checkpoint = os.path.join(grid.checkpoint_root or grid.run_dir, "checkpoints", cell_key,
                              f"trial-{number}.pt")
    heartbeat = Heartbeat(leases_for(grid.storage), lease_key or f"{study.study_name}#{number}",
                          pool_key)
    try:
        with heartbeat, worklog, pool_for(pool_key).acquire(c.network) as workers:
            state = train(config, TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test,
                                                        ds.y_test),
                          cluster=pool_for(pool_key).address, workers=workers,
                          callback=on_record, checkpoint_path=checkpoint, resume=True,
                          should_stop=lambda: "another run took the trial's lease"
                          if heartbeat.lost.is_set() else None,
                          deadline=grid.deadline or None)
    except OUTAGES:
        raise  # the stores do not answer: leave the run as it is (the rerun reopens it)
    except ClusterError as exc:  # the cluster went away (spot reclaim): not the trial's fault
        metrics.flush()
        terminate("KILLED")
        return {"number": number, "state": "INTERRUPTED", "reason": f"cluster lost: {exc}",
                "value": None, "run_id": run_id, "params": params}
    except BaseException:
        metrics.flush()
        terminate("FAILED")
        raise
    metrics.flush()
    if state.interrupted:
        terminate("KILLED")
        return {"number": number, "state": "INTERRUPTED", "reason": state.stopped,
                "value": None, "run_id": run_id, "params": params}
    work = worklog.totals()
    value, reached, best = objective(state.history, target=target)
    pruned = state.stopped is not None and state.stopped != TARGET_REACHED
    final = {"objective": value, "reached_target": float(reached), "best_accuracy": best,
             "updates": state.update, "examples_seen_total": state.examples_seen,
             "time_sim_total": state.time_sim, "time_elapsed_total": state.time_elapsed,
             "attempts": work["attempts"], "lost_updates_total": work["lost_updates"],
             "lost_seconds_total": work["lost_seconds"]}
    metrics.add(final, step=state.update)
    metrics.flush()
    tracking.with_retries(lambda: tracking.set_tags(
        client, run_id, {"damptune.state": "PRUNED" if pruned else "COMPLETE"}),
        what="tagging the trial's run")
    terminate("FINISHED")
    tracking.log_plots_later(client, run_id, state.history, target=target)  # cell waits
    return {"number": number, "state": "PRUNED" if pruned else "COMPLETE", "value": value,
            "reached": reached, "best_accuracy": best, "run_id": run_id, "params": params}
