"""Prefect tasks of the tuning pipeline: a cell's Optuna study, one trial, MLflow tracking, and
the grid's report (the ranking that answers the user's question, and its figures).

They adapt the engine's progress records to Optuna (report/prune) and MLflow (runs, metrics,
artifacts); the engine itself knows nothing of either.

The names below are imported on first use (PEP 562): a module such as ``tasks.report`` imports
only what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from damptune.lazy import lazy_exports

if TYPE_CHECKING:
    from tasks.answer import rank_cells, replay_on_profiles
    from tasks.callbacks import (
        CalibrationKeeper,
        PruningReporter,
        TrialCallback,
        WorkLogWriter,
    )
    from tasks.cell import run_cell
    from tasks.clusters import WorkerPool, open_cluster
    from tasks.driver import StudyDriver
    from tasks.figures import draw_figures
    from tasks.gpus import check_workers, local_cluster_for
    from tasks.grid import ALGORITHMS, MODEL_NAMES, Cell, GridSettings, cells_of
    from tasks.publish import publish_report
    from tasks.report import build_report, grid_rows, write_report, write_summary
    from tasks.results import TrialResult, TrialState
    from tasks.search import summarize
    from tasks.session import Session, open_session
    from tasks.trial import run_trial
    from tasks.trial_logger import MlflowTrialLogger

# module → the names it exports here (the same as the imports above, which type checkers read)
_EXPORTS = {
    "tasks.answer": ("rank_cells", "replay_on_profiles"),
    "tasks.callbacks": ("CalibrationKeeper", "PruningReporter", "TrialCallback", "WorkLogWriter"),
    "tasks.cell": ("run_cell",),
    "tasks.clusters": ("WorkerPool", "open_cluster"),
    "tasks.driver": ("StudyDriver",),
    "tasks.figures": ("draw_figures",),
    "tasks.gpus": ("check_workers", "local_cluster_for"),
    "tasks.grid": ("ALGORITHMS", "MODEL_NAMES", "Cell", "GridSettings", "cells_of"),
    "tasks.publish": ("publish_report",),
    "tasks.report": ("build_report", "grid_rows", "write_report", "write_summary"),
    "tasks.results": ("TrialResult", "TrialState"),
    "tasks.search": ("summarize",),
    "tasks.session": ("Session", "open_session"),
    "tasks.trial": ("run_trial",),
    "tasks.trial_logger": ("MlflowTrialLogger",),
}
__all__ = [  # the names of _EXPORTS (tests/test_packages.py)
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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
