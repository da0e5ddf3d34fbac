"""damptune: damped data-parallel SGD on Dask, and the search for the fastest damping.

The names below are imported on first use (PEP 562): ``damptune simulate``, ``damptune
--help`` and a module such as ``damptune.netmodel`` do not pay for torch and scikit-learn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [  # the names of _EXPORTS (tests/damptune/test_package.py)
    "DAMPERS", "CheckpointError", "ClusterError", "ConfigError", "DampedClassifier", "Damper",
    "DamptuneError", "EvalRecord", "Param", "Placement", "Progress", "Record", "ResumeRecord",
    "Step", "StopTraining", "TrainConfig", "TrainData", "TrainState", "UpdateRecord",
    "WorkerReport", "calibrate", "get_damper", "load_checkpoint", "place_ranks",
    "save_checkpoint", "train",
]


def __getattr__(name: str) -> Any:
    """A name of ``__all__``, imported from its module the first time it is asked for."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'damptune' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
