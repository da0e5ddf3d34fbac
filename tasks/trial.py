"""The trial task: train one damping configuration on its cell's ranks; report and log it.

The trial composes small callbacks (:mod:`tasks.callbacks`, :mod:`tasks.trial_logger`) around
one call of the engine's ``train`` and returns a :class:`~tasks.results.TrialResult`. Its value
is the objective of :mod:`tasks.objective`: simulated seconds to the target accuracy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from prefect import task
from prefect.cache_policies import NO_CACHE

from damptune import TrainConfig, TrainData, TrainState, interrupt, train
from damptune.checkpoint import checkpoint_exists, load_checkpoint, save_checkpoint
from damptune.config import cap_for, import_path
from damptune.trainer import STOPPED_BY_BOUND
from models import Dataset, load_dataset, model_class
from tasks import tracking
from tasks.callbacks import (
    CalibrationKeeper,
    PruningReporter,
    TrialCallback,
    WorkLogWriter,
    compose,
)
from tasks.driver import trial_handle
from tasks.faults import is_infrastructure_fault
from tasks.grid import Cell, GridSettings, checkpoint_path
from tasks.leases import Heartbeat
from tasks.mechanism import MECHANISM_ATTR, mechanism
from tasks.objective import (
    SCHEDULE_ATTR,
    Outcome,
    first_change_epoch,
    judge,
    objective,
)
from tasks.registry import dataset_input
from tasks.results import TrialResult, TrialState
from tasks.reuse import REUSED_ATTR, TRAINING_ATTR, Source, find_source, training_record
from tasks.search import (
    StorageUnavailable,
    best_value,
    open_study,
    pruner_acts_on_reports,
    with_storage_retries,
)
from tasks.session import Session, session_for
from tasks.trial_logger import MlflowTrialLogger
from tasks.worklog import WorkLog

__all__ = ["run_trial", "objective", "trial_config", "trial_callbacks"]

OUTAGES = (StorageUnavailable, tracking.TrackingUnavailable)


def trial_config(settings: GridSettings, cell: Cell, params: dict[str, Any],
                 dataset: Any, *, bound: float | None = None,
                 seed: int | None = None) -> TrainConfig:
    """The engine configuration of one trial. It stops at the model's target accuracy (with
    the budget objective it trains its whole budget: no stop, no dense evaluations), and
    once it has spent ``bound`` simulated seconds (the cell's best value so far: a trial
    slower than that can never win). ``seed``: its training seed (default the grid's; a
    validation trial's held-out seed)."""
    to_target = settings.objective == "target"
    cap = cap_for(cell.network, settings.per_worker_batch)
    damper_kwargs = {"initial": settings.initial_batch}
    damper_kwargs.update({k: v for k, v in params.items() if k != "lr"})
    damper_kwargs["initial"] = min(int(damper_kwargs["initial"]), cap)
    return TrainConfig(
        module=import_path(model_class(cell.model)),
        module_kwargs={"input_shape": tuple(dataset.input_shape),
                       "n_classes": int(dataset.n_classes)},
        optimizer_kwargs={"momentum": settings.momentum},
        lr=float(params.get("lr", settings.lr)), damper=cell.algorithm,
        damper_kwargs=damper_kwargs, max_batch_size=cap,
        per_worker_batch=settings.per_worker_batch, min_workers=1, max_workers=cell.network,
        max_epochs=settings.epochs_for(cell.model), eval_every=settings.eval_every,
        seed=settings.seed if seed is None else seed,
        eval_resolution=settings.eval_resolution,
        eval_dense_margin=settings.eval_dense_margin if to_target else 0.0,
        target_accuracy=settings.target_of(cell) if to_target else None, max_time_sim=bound,
        mode=settings.mode, device=settings.device, profile=settings.profile,
        overhead=_ms(settings.overhead_ms), overhead_per_rank=_ms(settings.overhead_per_rank_ms),
        checkpoint_every=settings.checkpoint_every or None,
        checkpoint_seconds=settings.checkpoint_seconds or None,
        eval_flush=pruner_acts_on_reports(settings.pruner),
        timeout=float(settings.extra.get("rank_timeout", 300.0)),
    )


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1e3


@task(name="trial", cache_policy=NO_CACHE, task_run_name="{cell_key}/trial-{number}")
def run_trial(
    *,
    settings: dict[str, Any],
    cell_key: str,
    cell: dict[str, Any],
    number: int,
    trial_id: int,
    params: dict[str, Any],
    session_key: str,
    experiment_id: str,
    parent_run_id: str,
    lease_key: str = "",
    seeded_from: str = "",
    train_seed: int | None = None,
) -> TrialResult:
    """Train trial ``number`` of the cell (continuing its checkpoint if there is one).

    Returns COMPLETE, PRUNED or INTERRUPTED. When the Optuna storage or MLflow stays
    unreachable through the retries, the trial is INTERRUPTED with ``outage`` set (not
    failed): its checkpoint, Optuna trial and MLflow run are left as they are, and a rerun
    continues it. A fault of the cluster (:mod:`tasks.faults`) makes it INTERRUPTED with
    ``fault`` set: its cell retries it. Any other error propagates: the cell records FAIL.
    """
    grid, c = GridSettings(**settings), Cell(**cell)
    session = session_for(session_key)
    data_seed = grid.data_seed_of(c, train_seed)
    ds = load_dataset(grid.dataset, seed=data_seed, root=grid.data_root or None)
    logger: MlflowTrialLogger | None = None
    try:
        setup = _setup(grid, c, ds, params=params, train_seed=train_seed)
        source = _source(grid, c, setup)
        logger = _trial_logger(grid, c, session, reused=source is not None)
        logger.open(experiment_id, parent_run_id=parent_run_id, cell_key=cell_key,
                    number=number, params=_run_params(grid, c, params, ds, train_seed),
                    seeded_from=seeded_from, dataset=dataset_input(ds, data_seed=data_seed))
        if source is not None:
            return _reuse(source, setup.study, judge=_judge(grid, c, ds),
                          checkpoint=checkpoint_path(grid, c, number), number=number,
                          trial_id=trial_id, params=params, logger=logger)
        return _train(grid, c, ds, setup, number=number, trial_id=trial_id, params=params,
                      session=session, logger=logger, lease_key=lease_key)
    except OUTAGES as exc:
        return TrialResult(number, TrialState.INTERRUPTED, params, reason=str(exc), outage=exc)
    finally:
        if logger is not None:  # a run left open (an outage): not its monitor
            logger.stop_system_metrics(wait=False)


def _trial_logger(grid: GridSettings, c: Cell, session: Session, *,
                  reused: bool) -> MlflowTrialLogger:
    """The trial's MLflow logger. A held-out seed's run (validation, matched) draws no plots:
    its configuration's search trial has them, and MLflow's charts compare the seeds' metrics
    (the plots cost ~0.25 s of the flow's CPU per trial). A reused training's run copies its
    source's plots, and has no system metrics: nothing runs."""
    plots = session.plots if c.stage == "search" else None
    return MlflowTrialLogger(session.tracking, plots, metrics_every=grid.metrics_every,
                             target=grid.target_of(c),
                             system_metrics=grid.system_metrics and not reused)


@dataclass(frozen=True)
class _Setup:
    """What a trial reads once, before it reuses a training or trains: its study, the study
    that keeps its cell's calibration (the search's), the data, its bound (the cell's best
    so far) and its configuration, calibrated when that can be done here."""

    study: optuna.Study
    keeper: optuna.Study
    data: TrainData
    bound: float | None
    config: TrainConfig


def _setup(grid: GridSettings, c: Cell, ds: Dataset, *, params: dict[str, Any],
           train_seed: int | None) -> _Setup:
    """The trial's :class:`_Setup`. On CPU the cell's first trial measures the calibration
    here, as its training would; on GPUs it is measured where rank 0 trains, so only a stored
    one is taken here."""
    # opening writes (Optuna's create_study inserts, then loads what exists): retried, as
    # every write of a trial, so a locked database is ridden out, not a FAIL trial
    study = with_storage_retries(lambda: open_study(grid, c, n_train=len(ds.y_train)))
    keeper = study if c.stage == "search" else with_storage_retries(
        lambda: open_study(grid, c.searched, n_train=len(ds.y_train)))
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    bound = best_value(study) if grid.pruner != "none" else None
    config = trial_config(grid, c, params, ds, bound=bound, seed=train_seed)
    calibrated = (CalibrationKeeper(keeper).resolve(config, data) if grid.device == "cpu"
                  else CalibrationKeeper(keeper).stored(config))
    return _Setup(study, keeper, data, bound, calibrated or config)


def _source(grid: GridSettings, c: Cell, setup: _Setup) -> Source | None:
    """The finished trial whose training this one would repeat (:mod:`tasks.reuse`), or
    None (also while the cell's calibration is not known here: that trial trains)."""
    if setup.config.compute_per_example is None:
        return None
    source = with_storage_retries(lambda: find_source(
        grid, c, setup.config, bound=setup.bound, workers=grid.trial_workers(c.network)))
    if source is None or not checkpoint_exists(source.training.get("checkpoint", "")):
        return None  # its weights are gone (another checkpoint_root): train
    return source


def _judge(grid: GridSettings, c: Cell, ds: Dataset) -> Callable[..., Outcome]:
    """The grid's objective of a finished history of ``c`` (:func:`tasks.objective.outcome`)."""
    return judge(target=grid.target_of(c), kind=grid.objective, n_train=len(ds.y_train))


def _reuse(source: Source, study: optuna.Study, *, judge: Callable[..., Outcome],
           checkpoint: str, number: int, trial_id: int, params: dict[str, Any],
           logger: MlflowTrialLogger) -> TrialResult:
    """The trial ends as ``source``'s training did, untrained: its reports in Optuna, its value
    and constraint judged on its history (:func:`_judge`: the same training), its final
    metrics in MLflow (:mod:`tasks.reuse`)."""
    handle, record = trial_handle(study, trial_id), source.training
    for step, value in sorted(source.trial.intermediate_values.items()):
        with_storage_retries(functools.partial(handle.report, value, step=step))
    weights = load_checkpoint(record["checkpoint"])
    save_checkpoint(checkpoint, weights)  # its weights: the cell logs its best's
    out = judge(weights["history"])
    result = TrialResult(number, TrialState.COMPLETE, params, value=out.value,
                         run_id=logger.run_id, reached=out.reached,
                         best_accuracy=out.best_accuracy,
                         examples_seen=record["examples_seen"], shortfall=out.shortfall,
                         reason=f"reused {source.key}",
                         user_attrs={TRAINING_ATTR: {**record, "run_id": logger.run_id,
                                                     "checkpoint": checkpoint},
                                     REUSED_ATTR: source.key, **_schedule_of(source.trial)})
    logger.finish_reused(result, source_run=record["run_id"])
    return result


def _run_params(grid: GridSettings, c: Cell, params: dict[str, Any], ds: Dataset,
                train_seed: int | None) -> dict[str, Any]:
    return {"algorithm": c.algorithm, "network": c.network, "model": c.model,
            "dataset": grid.dataset, "data_seed": grid.data_seed_of(c, train_seed),
            "data_digest": ds.digest(),
            "seed": grid.seed if train_seed is None else train_seed, "stage": c.stage,
            "mode": grid.mode, "device": grid.device,
            "dask_workers": grid.trial_workers(c.network),
            "profile": grid.profile, "target_accuracy": grid.target_of(c),
            "objective": grid.objective,
            "epochs": grid.epochs_for(c.model), **{f"hp.{k}": v for k, v in params.items()}}



def trial_callbacks(*, worklog: WorkLog, logger: MlflowTrialLogger,
                    pruner: PruningReporter) -> list[TrialCallback]:
    """The callbacks a trial composes, in the order they see each record (a new trial
    callback is added here): the work log, MLflow, then the one that may stop training."""
    return [WorkLogWriter(worklog, logger.log_resumed_attempt), logger, pruner]


def _train(grid: GridSettings, c: Cell, ds: Dataset, setup: _Setup, *, number: int,
           trial_id: int, params: dict[str, Any], session: Session, logger: MlflowTrialLogger,
           lease_key: str) -> TrialResult:
    """Compose the callbacks, train on the cell's ranks, and say how the trial ended."""
    study, data = setup.study, setup.data
    worklog = WorkLog(grid.run_dir, c.key, number)
    target = grid.target_of(c)
    pruner = PruningReporter(trial_handle(study, trial_id), target=target,
                             every_examples=round(grid.eval_every * len(ds.y_train)))
    callback = compose(trial_callbacks(worklog=worklog, logger=logger, pruner=pruner))
    heartbeat = Heartbeat(session.leases, lease_key or f"{study.study_name}#{number}",
                          session.key)
    try:
        with heartbeat, worklog, session.pool.acquire(grid.trial_workers(c.network)) as gang:
            # measured on rank 0's worker when ranks train on GPUs (here may have none)
            config = CalibrationKeeper(setup.keeper).resolve(
                setup.config, data, client=session.pool.client,
                worker=next(iter(gang.addresses), None))
            state = train(config, data, cluster=session.pool.address, workers=gang,
                          callback=callback, checkpoint_path=checkpoint_path(grid, c, number),
                          resume=True, should_stop=heartbeat.stop_reason,
                          deadline=grid.deadline or None)
    except OUTAGES:
        raise  # the stores do not answer: leave the run as it is (the rerun reopens it)
    except Exception as exc:
        if not is_infrastructure_fault(exc):  # its own error: retrying cannot help
            logger.end("FAILED")
            raise
        logger.end("KILLED")  # a lost worker, a rank timeout: not the trial's fault
        stopping = interrupt.requested()
        if stopping:  # part of the stop (a shutdown takes the workers too): no retry
            return TrialResult(number, TrialState.INTERRUPTED, params, run_id=logger.run_id,
                               reason=f"interrupted: {stopping} ({exc})")
        return TrialResult(number, TrialState.INTERRUPTED, params, run_id=logger.run_id,
                           reason=f"cluster fault: {exc}", fault=exc)
    training = training_record(config, state.history, workers=grid.trial_workers(c.network))
    if training is not None:  # where a reuse finds its weights (the cell's model is logged)
        training["checkpoint"] = checkpoint_path(grid, c, number)
    return _outcome(state, number=number, params=params, logger=logger,
                    judge=_judge(grid, c, ds), pruned=pruner.pruned, work=worklog.totals(),
                    training=training, target=target)


def _complete_attrs(state: TrainState, training: dict[str, Any] | None, *,
                    target: float) -> dict[str, Any]:
    """A COMPLETE trial's user attributes: what reuses it (when it may be reused), when its
    schedule first changed the batch size or learning rate (:func:`first_change_epoch`), and
    its updates, epochs and simulated seconds per profile to ``target`` (test accuracy) with
    its mean batch and most ranks (:func:`tasks.mechanism.mechanism`)."""
    attrs: dict[str, Any] = {SCHEDULE_ATTR: first_change_epoch(state.history),
                             MECHANISM_ATTR: mechanism(state.history, target=target,
                                                       config=state.config,
                                                       n_params=state.n_params)}
    if training:
        attrs[TRAINING_ATTR] = training
    return attrs


def _schedule_of(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The schedule and mechanism attributes of a reused trial's source (its training is the
    same), those it has (a grid from before they were recorded has not)."""
    return {k: trial.user_attrs[k] for k in (SCHEDULE_ATTR, MECHANISM_ATTR)
            if k in trial.user_attrs}


def _outcome(state: TrainState, *, number: int, params: dict[str, Any],
             logger: MlflowTrialLogger, judge: Callable[..., Outcome], pruned: bool,
             work: dict[str, Any], training: dict[str, Any] | None,
             target: float) -> TrialResult:
    """The trial's result from its final state; its MLflow run ends accordingly. A trial
    stopped by its simulated-time bound is PRUNED: it could not beat the cell's best.
    ``target``: the cell's target accuracy (its mechanism's, :func:`_complete_attrs`)."""
    if state.interrupted:
        logger.end("KILLED")
        return TrialResult(number, TrialState.INTERRUPTED, params, run_id=logger.run_id,
                           reason=state.stopped or "interrupted")
    out = judge(state.history)
    bounded = not out.reached and state.stopped == STOPPED_BY_BOUND
    complete = not (pruned or bounded)
    if training is not None:  # what a trial of another network size may reuse (tasks.reuse)
        training = {**training, "run_id": logger.run_id, "reached": out.reached,
                    "best_accuracy": out.best_accuracy, "examples_seen": state.examples_seen}
    result = TrialResult(number, TrialState.COMPLETE if complete else TrialState.PRUNED,
                         params, value=out.value, run_id=logger.run_id, reached=out.reached,
                         best_accuracy=out.best_accuracy, examples_seen=state.examples_seen,
                         shortfall=out.shortfall,
                         reason=state.stopped or "",
                         user_attrs=(_complete_attrs(state, training, target=target)
                                     if complete else {}))
    logger.finish(result, state, work)
    return result
