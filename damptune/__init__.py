"""damptune: damped data-parallel SGD on Dask, and the search for the fastest damping."""

from damptune.checkpoint import load_checkpoint, save_checkpoint
from damptune.config import TrainConfig
from damptune.dampers import DAMPERS, Damper, Param, Progress, Step, get_damper
from damptune.devices import Placement, WorkerReport, place_ranks
from damptune.errors import CheckpointError, ClusterError, ConfigError, DamptuneError, StopTraining
from damptune.estimator import DampedClassifier
from damptune.records import EvalRecord, Record, ResumeRecord, UpdateRecord
from damptune.state import TrainData, TrainState
from damptune.trainer import calibrate, train

__all__ = [
    "DAMPERS",
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "DampedClassifier",
    "Damper",
    "DamptuneError",
    "EvalRecord",
    "Param",
    "Placement",
    "Progress",
    "Record",
    "ResumeRecord",
    "Step",
    "StopTraining",
    "TrainConfig",
    "TrainData",
    "TrainState",
    "UpdateRecord",
    "WorkerReport",
    "calibrate",
    "get_damper",
    "load_checkpoint",
    "place_ranks",
    "save_checkpoint",
    "train",
]
