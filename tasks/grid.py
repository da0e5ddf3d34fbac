"""The grid: cells (network size × algorithm × model) and the settings shared by their trials."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from damptune import DAMPERS, ConfigError
from damptune.netmodel import get_profile
from models import DATASETS, MODELS

__all__ = ["Cell", "GridSettings", "cells_of", "ALGORITHMS", "MODEL_NAMES", "DEFAULT_TARGETS"]

ALGORITHMS = ("geodamplr", "cntsdamplr", "geodamp", "padadamp", "adadamp", "radadamp")
MODEL_NAMES = ("mlp", "cnn")
# reached after about 2-4 epochs of MNIST-1D at batch 32: the objective tells trials apart
DEFAULT_TARGETS = {"mlp": 0.5, "cnn": 0.7, "wrn16_4": 0.9}


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: a network size (ranks), a damping algorithm and a model."""

    network: int
    algorithm: str
    model: str

    @property
    def key(self) -> str:
        return f"n{self.network}/{self.algorithm}/{self.model}"


@dataclass
class GridSettings:
    """What every trial of a grid shares (units in names or comments)."""

    grid_name: str = "grid"
    dataset: str = "mnist1d"
    trials: int = 3  # per cell, in all (a rerun tops up)
    epochs: float = 6.0  # training budget per trial, in epochs (a trial stops at its target)
    # test accuracy at which the objective's clock stops: one for all models, or per model
    target_accuracy: float | dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_TARGETS))
    profile: str = "decentralized-moderate"
    mode: str = "centralized"
    per_worker_batch: int = 32  # examples per rank; the cap is network × per_worker_batch
    initial_batch: int = 32  # B0 of the dampers that do not tune it (examples)
    lr: float = 0.05
    momentum: float = 0.9
    eval_every: float = 1.0  # epochs
    seed: int = 0
    sampler: str = "tpe"
    pruner: str = "hyperband"
    run_dir: str = ""
    storage: str = ""  # Optuna storage URL
    tracking_uri: str = ""  # MLflow tracking URI
    metrics_every: int = 5  # log update metrics to MLflow every N updates (and on changes)
    checkpoint_every: int = 0  # updates between a trial's checkpoints (0: by time only)
    checkpoint_seconds: float = 30.0  # seconds of training between a trial's checkpoints
    deadline: float = 0.0  # time.time() by which trials checkpoint and stop (0: none)
    checkpoint_root: str = ""  # where trial checkpoints go: a path or fsspec URL (default run dir)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def target_for(self, model: str) -> float:
        if isinstance(self.target_accuracy, dict):
            return float(self.target_accuracy[model])
        return float(self.target_accuracy)


def _number_in(name: str, value: Any, low: float, high: float, accepted: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(name, value, accepted)
    if not low < value <= high:
        raise ConfigError(name, value, accepted)


def cells_of(
    *, networks: list[int], algorithms: list[str], models: list[str], settings: GridSettings
) -> list[Cell]:
    """Validate the grid's parameters (before any work) and list its cells."""
    if not networks:
        raise ConfigError("networks", networks, "a non-empty list of network sizes (ranks)")
    for n in networks:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("networks", networks, "network sizes that are integers >= 1")
    if not algorithms:
        raise ConfigError("algorithms", algorithms, f"a non-empty list from {sorted(DAMPERS)}")
    for a in algorithms:
        if a not in DAMPERS:
            raise ConfigError("algorithms", a, f"names from {sorted(DAMPERS)}")
    if not models:
        raise ConfigError("models", models, f"a non-empty list from {sorted(MODELS)}")
    for m in models:
        if m not in MODELS:
            raise ConfigError("models", m, f"names from {sorted(MODELS)}")
    if settings.dataset not in DATASETS:
        raise ConfigError("dataset", settings.dataset, f"one of {list(DATASETS)}")
    if isinstance(settings.trials, bool) or not isinstance(settings.trials, int) or (
        settings.trials <= 0
    ):
        raise ConfigError("trials", settings.trials, "a positive integer (trials per cell)")
    targets = settings.target_accuracy
    if isinstance(targets, dict):
        missing = [m for m in models if m not in targets]
        if missing:
            raise ConfigError("target_accuracy", targets,
                              f"an accuracy in (0, 1] for every model (missing {missing})")
        for value in targets.values():
            _number_in("target_accuracy", value, 0, 1, "accuracies in (0, 1]")
    else:
        _number_in("target_accuracy", targets, 0, 1, "an accuracy in (0, 1]")
    _number_in("epochs", settings.epochs, 0, math.inf, "a positive number of epochs")
    _number_in("lr", settings.lr, 0, math.inf, "a positive learning rate")
    for name in ("per_worker_batch", "initial_batch"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "a positive integer (examples)")
    get_profile(settings.profile)
    if settings.mode not in ("centralized", "decentralized"):
        raise ConfigError("mode", settings.mode, "'centralized' or 'decentralized'")
    if settings.sampler not in ("tpe", "gp"):
        raise ConfigError("sampler", settings.sampler, "'tpe' or 'gp'")
    if settings.pruner not in ("hyperband", "sha", "none"):
        raise ConfigError("pruner", settings.pruner, "'hyperband', 'sha' or 'none'")
    if not settings.grid_name or "/" in settings.grid_name:
        raise ConfigError("grid_name", settings.grid_name, "a non-empty name without '/'")
    cells = [Cell(n, a, m) for n in sorted(set(networks)) for a in dict.fromkeys(algorithms)
             for m in dict.fromkeys(models)]
    return cells
