"""The engine's configuration: one plain, validated, serializable record."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from damptune.dampers import Damper, get_damper
from damptune.errors import ConfigError
from damptune.imports import import_path, resolve
from damptune.netmodel import CostModel, get_profile
from damptune.validate import choice, non_negative_float, positive_float, positive_int

__all__ = ["TrainConfig", "MODES", "import_path", "resolve", "n_workers_for", "cap_for"]

MODES = ("local", "centralized", "decentralized")
# Fields that define the math of a run: a checkpoint written under other values cannot continue.
IDENTITY_FIELDS = (
    "module",
    "module_kwargs",
    "optimizer",
    "optimizer_kwargs",
    "lr",
    "damper",
    "damper_kwargs",
    "max_batch_size",
    "seed",
    "n_train",
)


@dataclass
class TrainConfig:
    """Everything the engine needs to train and to continue exactly.

    Units: sizes in examples, ``max_epochs``/``eval_every`` in epochs (passes over the training
    set), ``checkpoint_every`` in model updates.
    """

    module: str
    module_kwargs: dict[str, Any] = field(default_factory=dict)
    optimizer: str = "torch.optim.sgd:SGD"
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    lr: float = 0.05
    damper: str = "sgd"
    damper_kwargs: dict[str, Any] = field(default_factory=dict)
    max_batch_size: int = 1024  # examples; the cap of the cap-then-decay rule
    per_worker_batch: int = 128  # examples per rank at which another rank is added
    min_workers: int = 1
    max_workers: int = 8
    max_epochs: float = 10.0
    max_updates: int | None = None  # stop after this many updates in all (None: no limit)
    eval_every: float = 1.0  # epochs
    checkpoint_every: int | None = None  # updates (None: only at the end)
    checkpoint_seconds: float | None = None  # seconds of training between checkpoints
    checkpoint_keep: int = 2  # generations kept (an unreadable newest one falls back)
    seed: int = 0
    mode: str = "local"
    device: str = "cpu"
    backend: str = "gloo"
    train_loss_examples: int = 1024  # size of the fixed training subset for AdaDamp's F(w)
    n_train: int = 0  # set from the data
    # network cost model (damptune.netmodel): the records' simulated time `time_sim`
    profile: str = "decentralized-moderate"
    compute_per_example: float | None = None  # seconds per example on one rank (None: measure)
    compute_fixed: float | None = None  # seconds per update on one rank, besides the examples
    overhead: float = 0.0  # seconds per update (optimizer step, framework)
    timeout: float = 120.0  # seconds any remote wait may take

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def identity(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in IDENTITY_FIELDS}

    def cost_model(self, n_params: int) -> CostModel:
        """The cost model of this run's profile (compute must be calibrated or given)."""
        return CostModel(
            network=get_profile(self.profile),
            n_params=n_params,
            compute_per_example=self.compute_per_example or 0.0,
            compute_fixed=self.compute_fixed or 0.0,
            overhead=self.overhead,
        )

    def make_damper(self) -> Damper:
        return get_damper(self.damper, **self.damper_kwargs)

    def validate(self) -> None:
        """Raise :class:`ConfigError` for the first invalid value (before any work starts)."""
        choice("mode", self.mode, MODES)
        for name in ("max_batch_size", "per_worker_batch", "min_workers", "max_workers",
                     "train_loss_examples", "checkpoint_keep"):
            positive_int(name, getattr(self, name))
        if self.min_workers > self.max_workers:
            raise ConfigError(
                "min_workers", self.min_workers, f"at most max_workers={self.max_workers}"
            )
        for name in ("lr", "max_epochs", "eval_every", "timeout"):
            positive_float(name, getattr(self, name))
        if self.checkpoint_seconds is not None:
            positive_float("checkpoint_seconds", self.checkpoint_seconds,
                           "a positive number of seconds")
        for name in ("max_updates", "checkpoint_every"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        damper = self.make_damper()
        damper._check()
        if damper.initial > self.max_batch_size:
            raise ConfigError(
                "max_batch_size",
                self.max_batch_size,
                f"at least the initial batch size batch_size__initial={damper.initial}",
            )
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ConfigError("device", self.device, "'cpu', 'cuda', 'cuda:N' or 'auto'")
        get_profile(self.profile)
        for name in ("compute_per_example", "compute_fixed", "overhead"):
            if getattr(self, name) is not None:
                non_negative_float(name, getattr(self, name), "a non-negative number of seconds")
        choice("backend", self.backend, ("gloo", "nccl"))


def cap_for(n_workers: int, per_worker_batch: int) -> int:
    """The batch-size cap of a cluster of ``n_workers`` ranks, in examples: the one place where
    the cluster size enters the cap-then-decay rule.

    Example:
        >>> cap_for(4, 32)
        128
    """
    return int(n_workers) * int(per_worker_batch)


def n_workers_for(batch_size: int, config: TrainConfig) -> int:
    """Ranks for a batch: ``clip(ceil(B / per_worker_batch), min_workers, max_workers)``."""
    p = math.ceil(batch_size / config.per_worker_batch)
    return int(min(max(p, config.min_workers), config.max_workers))
