"""Prefect tasks of the tuning pipeline: a cell's Optuna study, one trial, MLflow tracking.

They adapt the engine's progress records to Optuna (report/prune) and MLflow (runs, metrics,
artifacts); the engine itself knows nothing of either.
"""

from tasks.cell import run_cell, summarize
from tasks.clusters import WorkerPool, open_cluster
from tasks.grid import ALGORITHMS, MODEL_NAMES, Cell, GridSettings, cells_of
from tasks.report import grid_rows, write_summary
from tasks.trial import objective, run_trial

__all__ = [
    "ALGORITHMS",
    "MODEL_NAMES",
    "Cell",
    "GridSettings",
    "WorkerPool",
    "cells_of",
    "grid_rows",
    "objective",
    "open_cluster",
    "run_cell",
    "run_trial",
    "summarize",
    "write_summary",
]
