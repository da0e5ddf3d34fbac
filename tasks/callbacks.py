"""A trial is a composition of small callbacks, one concern each (as Optuna's integrations).

Each callback receives the engine's typed progress records (:mod:`damptune.records`) in the
order the trial composes them, and may raise :class:`~damptune.StopTraining` to end training:

* :class:`WorkLogWriter` — the trial's work log (lost work across attempts);
* :class:`~tasks.trial_logger.MlflowTrialLogger` — the trial's MLflow run;
* :class:`TargetStop` — stop when an evaluation reaches the target accuracy;
* :class:`PruningReporter` — report to Optuna and stop when its pruner says so.

:class:`CalibrationKeeper` acts before training: one compute calibration per study.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import optuna

from damptune import EvalRecord, Record, StopTraining, TrainConfig, TrainData, calibrate
from tasks.search import with_storage_retries
from tasks.worklog import WorkLog

__all__ = ["TrialCallback", "TargetStop", "PruningReporter", "WorkLogWriter",
           "CalibrationKeeper", "compose", "CALIBRATION_ATTR"]

CALIBRATION_ATTR = "compute_calibration"  # [fixed s, s per example] of one rank


class TrialCallback(Protocol):
    """Anything called with each progress record of a trial."""

    def __call__(self, record: Record) -> None: ...


def compose(callbacks: Sequence[TrialCallback]) -> Callable[[Record], None]:
    """One engine callback that calls each of ``callbacks`` in order."""

    def callback(record: Record) -> None:
        for each in callbacks:
            each(record)

    return callback


class TargetStop:
    """Stops training at the first evaluation that reaches ``target`` (test accuracy): the
    objective's clock stops there, so training on cannot change the trial's value."""

    def __init__(self, target: float) -> None:
        self.target = target
        self.reached = False

    def __call__(self, record: Record) -> None:
        if isinstance(record, EvalRecord) and record.test_accuracy >= self.target:
            self.reached = True
            raise StopTraining("the target accuracy was reached")


class PruningReporter:
    """Reports each evaluation's test error (1 − accuracy) to the Optuna trial at its examples
    seen, and stops training, *pruned*, when the study's pruner says so."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial
        self.pruned = False

    def __call__(self, record: Record) -> None:
        if not isinstance(record, EvalRecord):
            return
        with_storage_retries(lambda: self.trial.report(1.0 - record.test_accuracy,
                                                       step=int(record.examples_seen)))
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
    """One compute calibration per study, kept in it (user attribute ``compute_calibration``):
    a rerun on another machine (a spot replacement) simulates the cell's remaining trials with
    the same numbers as the first run."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def resolve(self, config: TrainConfig, data: TrainData) -> TrainConfig:
        """``config`` with the study's calibration, measured and stored first if it has none."""
        stored = with_storage_retries(lambda: self.study.user_attrs.get(CALIBRATION_ATTR))
        if stored:
            fixed, per_example = map(float, stored)
            return dataclasses.replace(config, compute_fixed=fixed,
                                       compute_per_example=per_example)
        config = calibrate(config, data)
        calibration = [config.compute_fixed, config.compute_per_example]
        with_storage_retries(lambda: self.study.set_user_attr(CALIBRATION_ATTR, calibration))
        return config
