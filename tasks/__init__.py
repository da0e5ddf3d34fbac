"""Prefect tasks of the tuning pipeline: a cell's Optuna study, one trial, MLflow tracking.

They adapt the engine's progress records to Optuna (report/prune) and MLflow (runs, metrics,
artifacts); the engine itself knows nothing of either.
"""

from tasks.callbacks import (
    CalibrationKeeper,
    PruningReporter,
    TrialCallback,
    WorkLogWriter,
)
from tasks.cell import run_cell, summarize
from tasks.clusters import WorkerPool, open_cluster
from tasks.driver import StudyDriver
from tasks.gpus import check_workers, local_cluster_for
from tasks.grid import ALGORITHMS, MODEL_NAMES, Cell, GridSettings, cells_of
from tasks.objective import objective
from tasks.report import grid_rows, write_summary
from tasks.results import TrialResult, TrialState
from tasks.session import Session, open_session
from tasks.trial import run_trial
from tasks.trial_logger import MlflowTrialLogger

__all__ = [
    "ALGORITHMS",
    "MODEL_NAMES",
    "CalibrationKeeper",
    "Cell",
    "GridSettings",
    "MlflowTrialLogger",
    "PruningReporter",
    "Session",
    "StudyDriver",
    "TrialCallback",
    "TrialResult",
    "TrialState",
    "WorkLogWriter",
    "WorkerPool",
    "cells_of",
    "check_workers",
    "grid_rows",
    "local_cluster_for",
    "objective",
    "open_cluster",
    "open_session",
    "run_cell",
    "run_trial",
    "summarize",
    "write_summary",
]
