"""A trial is a composition of small callbacks, one concern each (as Optuna's integrations).

Each callback receives the engine's typed progress records (:mod:`damptune.records`) in the
order the trial composes them, and may raise :class:`~damptune.StopTraining` to end training:

* :class:`WorkLogWriter` — the trial's work log (lost work across attempts);
* :class:`~tasks.trial_logger.MlflowTrialLogger` — the trial's MLflow run;
* :class:`PruningReporter` — report the objective so far to Optuna and stop when its pruner
  says so.

:class:`CalibrationKeeper` acts before training: one compute calibration per study. Stopping at
the target accuracy and at the cell's best value (a trial whose simulated time already exceeds
it can never win) is the engine's (``target_accuracy``, ``max_time_sim``): it stops on the
update itself, not a segment later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import optuna

from damptune import EvalRecord, Record, StopTraining, TrainConfig, TrainData, calibrate
from damptune.config import CALIBRATION_FIELDS
from damptune.trainer import with_calibration
from tasks.objective import value_so_far
from tasks.search import with_storage_retries
from tasks.worklog import WorkLog

__all__ = ["TrialCallback", "PruningReporter", "WorkLogWriter",
           "CalibrationKeeper", "compose", "CALIBRATION_ATTR"]

CALIBRATION_ATTR = "compute_calibration"  # {field: seconds} of one rank (CALIBRATION_FIELDS)


class TrialCallback(Protocol):
    """Anything called with each progress record of a trial."""

    def __call__(self, record: Record) -> None: ...


def compose(callbacks: Sequence[TrialCallback]) -> Callable[[Record], None]:
    """One engine callback that calls each of ``callbacks`` in order."""

    def callback(record: Record) -> None:
        for each in callbacks:
            each(record)

    return callback


class PruningReporter:
    """Reports the trial's objective so far (:func:`tasks.objective.value_so_far`: its
    simulated time, scaled up by its shortfall while the target is not reached) to Optuna at
    its examples seen, at every evaluation at least ``every_examples`` after the last report
    (the grid's ``eval_every`` epochs: the dense evaluations that resolve the objective are not
    all written to the storage), and stops training, *pruned*, when the study's pruner says so.
    """

    def __init__(self, trial: optuna.Trial, *, target: float, every_examples: int) -> None:
        self.trial, self.target, self.every = trial, target, max(1, every_examples)
        self.pruned = False
        self.next_report = self.every

    def __call__(self, record: Record) -> None:
        if not isinstance(record, EvalRecord):
            return
        if record.examples_seen < self.next_report:
            return
        while self.next_report <= record.examples_seen:
            self.next_report += self.every
        value = value_so_far(record.time_sim, best_accuracy=record.best_accuracy,
                             target=self.target)
        with_storage_retries(lambda: self.trial.report(value, step=int(record.examples_seen)))
        if with_storage_retries(self.trial.should_prune):
            self.pruned = True
            raise StopTraining(f"pruned by Optuna at {record.examples_seen} examples")


class WorkLogWriter:
    """Feeds the trial's work log; tells ``on_resumed_attempt`` what a resumed attempt redoes
    (its number, the update it resumed at, the updates and seconds its predecessor lost)."""

    def __init__(self, worklog: WorkLog,
                 on_resumed_attempt: Callable[[dict[str, Any]], None]) -> None:
        self.worklog, self.on_resumed_attempt = worklog, on_resumed_attempt

    def __call__(self, record: Record) -> None:
        started = self.worklog.record(record)
        if started is not None and started["attempt"] > 1:
            self.on_resumed_attempt(started)


class CalibrationKeeper:
    """One compute calibration per study, kept in it (user attribute ``compute_calibration``,
    the fields of :data:`damptune.config.CALIBRATION_FIELDS`): a rerun on another machine (a
    spot replacement) simulates the cell's remaining trials with the same numbers as the first
    run."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def resolve(self, config: TrainConfig, data: TrainData, *, client: Any = None,
                worker: str | None = None) -> TrainConfig:
        """``config`` with the study's calibration, measured and stored first if it has none
        (on ``worker`` of ``client`` when ranks train on GPUs: ``damptune.calibrate``)."""
        known = self.stored(config)
        if known is not None:
            return known
        config = calibrate(config, data, client=client, worker=worker)
        calibration = {k: getattr(config, k) for k in CALIBRATION_FIELDS}
        with_storage_retries(lambda: self.study.set_user_attr(CALIBRATION_ATTR, calibration))
        return config

    def stored(self, config: TrainConfig) -> TrainConfig | None:
        """``config`` with the study's calibration, or None while it has none."""
        stored = with_storage_retries(lambda: self.study.user_attrs.get(CALIBRATION_ATTR))
        if isinstance(stored, dict) and set(CALIBRATION_FIELDS) <= set(stored):
            return with_calibration(config, stored)
        return None
