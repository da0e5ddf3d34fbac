"""Prefect tasks of the tuning pipeline: a cell's Optuna study, one trial, MLflow tracking, and
the grid's report (the ranking that answers the user's question, and its figures).

They adapt the engine's progress records to Optuna (report/prune) and MLflow (runs, metrics,
artifacts); the engine itself knows nothing of either.
"""

from tasks.answer import rank_cells, replay_on_profiles
from tasks.callbacks import (
    CalibrationKeeper,
    PruningReporter,
    TrialCallback,
    WorkLogWriter,
)
from tasks.cell import run_cell, summarize
from tasks.clusters import WorkerPool, open_cluster
from tasks.driver import StudyDriver
from tasks.figures import draw_figures
from tasks.gpus import check_workers, local_cluster_for
from tasks.grid import ALGORITHMS, MODEL_NAMES, Cell, GridSettings, cells_of
from tasks.objective import objective
from tasks.publish import publish_report
from tasks.report import build_report, grid_rows, write_report, write_summary
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
    "build_report",
    "cells_of",
    "check_workers",
    "draw_figures",
    "grid_rows",
    "local_cluster_for",
    "objective",
    "open_cluster",
    "open_session",
    "publish_report",
    "rank_cells",
    "replay_on_profiles",
    "run_cell",
    "run_trial",
    "summarize",
    "write_report",
    "write_summary",
]
