"""damptune: damped data-parallel SGD on Dask, and the search for the fastest damping.

The names below are imported on first use (PEP 562): ``damptune simulate``, ``damptune
--help`` and a module such as ``damptune.netmodel`` do not pay for torch and scikit-learn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from damptune.lazy import lazy_exports

if TYPE_CHECKING:
    from damptune.checkpoint import load_checkpoint, save_checkpoint
    from damptune.config import TrainConfig
    from damptune.dampers import DAMPERS, Damper, Param, Progress, Step, get_damper
    from damptune.devices import Placement, WorkerReport, place_ranks
    from damptune.errors import (
        CheckpointError,
        ClusterError,
        ConfigError,
        DamptuneError,
        StopTraining,
    )
    from damptune.estimator import DampedClassifier
    from damptune.records import EvalRecord, Record, ResumeRecord, UpdateRecord
    from damptune.state import TrainData, TrainState
    from damptune.trainer import calibrate, train

# module → the names it exports here (the same as the imports above, which type checkers read)
_EXPORTS = {
    "damptune.checkpoint": ("load_checkpoint", "save_checkpoint"),
    "damptune.config": ("TrainConfig",),
    "damptune.dampers": ("DAMPERS", "Damper", "Param", "Progress", "Step", "get_damper"),
    "damptune.devices": ("Placement", "WorkerReport", "place_ranks"),
    "damptune.errors": ("CheckpointError", "ClusterError", "ConfigError", "DamptuneError",
                        "StopTraining"),
    "damptune.estimator": ("DampedClassifier",),
    "damptune.records": ("EvalRecord", "Record", "ResumeRecord", "UpdateRecord"),
    "damptune.state": ("TrainData", "TrainState"),
    "damptune.trainer": ("calibrate", "train"),
}
__all__ = [  # the names of _EXPORTS (tests/test_packages.py)
    "DAMPERS", "CheckpointError", "ClusterError", "ConfigError", "DampedClassifier", "Damper",
    "DamptuneError", "EvalRecord", "Param", "Placement", "Progress", "Record", "ResumeRecord",
    "Step", "StopTraining", "TrainConfig", "TrainData", "TrainState", "UpdateRecord",
    "WorkerReport", "calibrate", "get_damper", "load_checkpoint", "place_ranks",
    "save_checkpoint", "train",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
