"""damptune: damped data-parallel SGD on Dask, and the search for the fastest damping."""

from damptune.checkpoint import load_checkpoint, save_checkpoint
from damptune.config import TrainConfig
from damptune.dampers import DAMPERS, Damper, Param, Progress, Step, get_damper
from damptune.errors import CheckpointError, ClusterError, ConfigError, DamptuneError, StopTraining
from damptune.estimator import DampedClassifier
from damptune.state import TrainData, TrainState
from damptune.trainer import train

__all__ = [
    "DAMPERS",
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "DampedClassifier",
    "Damper",
    "DamptuneError",
    "Param",
    "Progress",
    "Step",
    "StopTraining",
    "TrainConfig",
    "TrainData",
    "TrainState",
    "get_damper",
    "load_checkpoint",
    "save_checkpoint",
    "train",
]
