"""The engine's configuration: one plain, validated, serializable record."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from damptune.dampers import Damper, get_damper
from damptune.devices import BACKENDS, parse_device
from damptune.errors import ConfigError
from damptune.imports import import_path, resolve
from damptune.netmodel import DEFAULT_PROFILE, CostModel, get_profile
from damptune.tolerance import parse_sync
from damptune.validate import (
    choice,
    non_negative_float,
    number_in,
    positive_float,
    positive_int,
)

__all__ = ["TrainConfig", "MODES", "CALIBRATION_FIELDS", "import_path", "resolve",
           "n_workers_for", "cap_for", "SIZE_FIELDS", "training_digest", "least_cap"]

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


# Fields that do not change what a run computes on a larger network while its batches fit the
# smaller one's cap (:func:`least_cap`): the network's size (its cap and the ranks allowed), the
# simulated-time bound (it only stops the run), and how the run checkpoints, reports and waits.
SIZE_FIELDS = ("max_batch_size", "max_workers", "max_time_sim", "checkpoint_every",
               "checkpoint_seconds", "checkpoint_keep", "flush_seconds", "timeout")


# One rank's measured compute (damptune.trainer.calibrate): kept per study and per checkpoint
CALIBRATION_FIELDS = ("compute_fixed", "compute_per_example", "compute_forward_fixed",
                      "compute_forward_per_example", "compute_norm")


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
    # examples per forward+backward pass: a rank's larger share is computed in micro-batches
    # whose gradients add up (None: per_worker_batch); bounds a rank's memory, not its math.
    # The local mode (the single-process reference, the floor of the time measured here) uses
    # one pass per update unless this is set; the simulated time charges per_worker_batch.
    micro_batch: int | None = None
    min_workers: int = 1
    max_workers: int = 8
    max_epochs: float = 10.0
    max_updates: int | None = None  # stop after this many updates in all (None: no limit)
    eval_every: float = 1.0  # epochs
    # relative spacing of the evaluations that resolve the time to a target: evaluate after
    # the update whose examples seen first reach (1 + eval_resolution) × those of the previous
    # evaluation (0: only every eval_every epochs). 0.02 resolves it to within 2 %.
    eval_resolution: float = 0.0
    # with target_accuracy: evaluate after every update while the last evaluation was within
    # this margin below the target (0: off), so a first crossing is found on its update
    eval_dense_margin: float = 0.0
    # with target_accuracy and eval_dense_margin m > 0: an evaluation the regular schedule
    # (eval_every) did not ask for, whose accuracy is more than m below the target, is a
    # check: it only decides that no update is evaluated densely yet, so it records nothing
    # and stops as soon as that is certain (False: every evaluation is recorded in full)
    eval_checks: bool = True
    # stop training at the first evaluation whose test accuracy reaches this (None: never)
    target_accuracy: float | None = None
    max_time_sim: float | None = None  # stop once this many simulated seconds are spent
    checkpoint_every: int | None = None  # updates (None: only at the end)
    checkpoint_seconds: float | None = None  # seconds of training between checkpoints
    checkpoint_keep: int = 2  # generations kept (an unreadable newest one falls back)
    # seconds of training after which the ranks end a segment and report to the driver (it
    # sees progress, stop requests and preemption notices between segments)
    flush_seconds: float = 1.0
    # a regular evaluation (every eval_every epochs) also ends the ranks' segment, so the
    # callbacks see it before training goes on (a callback that stops training at an
    # evaluation, such as a pruner, needs this). False: the evaluation travels with the
    # segment's other records, and the segment ends at a checkpoint, the end, or after
    # flush_seconds; the training and every record are the same, with fewer round trips
    eval_flush: bool = True
    seed: int = 0
    mode: str = "local"
    device: str = "cpu"  # 'cpu', 'cuda', 'cuda:N' or 'auto' (damptune.devices)
    # the ranks' process group: 'auto' (NCCL when every rank has a GPU of its own, else
    # gloo), 'gloo' or 'nccl'
    backend: str = "auto"
    share_gpus: bool = False  # let ranks share a GPU (then gloo); else an error
    train_loss_examples: int = 1024  # size of the fixed training subset for AdaDamp's F(w)
    n_train: int = 0  # set from the data
    # network cost model (damptune.netmodel): the records' simulated time `time_sim`
    profile: str = DEFAULT_PROFILE
    compute_per_example: float | None = None  # seconds per example on one rank (None: measure)
    compute_fixed: float | None = None  # seconds per update on one rank, besides the examples
    # forward pass only (the damper's loss pass): seconds per example and per pass on one rank
    # (measured with compute_per_example; None when that is given: a third of it)
    compute_forward_per_example: float | None = None
    compute_forward_fixed: float | None = None
    compute_norm: float | None = None  # seconds of the gradient's squared norm (RadaDamp)
    # orchestration overhead per update, fixed and per rank, in seconds (None: the profile's)
    overhead: float | None = None
    overhead_per_rank: float | None = None
    # how an update tolerates the profile's stragglers (damptune.tolerance): "sync" waits for
    # every rank; "backup:B" drops the B slowest ranks' gradients; "ssp:S" lets ranks compute
    # on weights up to S updates stale (mode centralized or local)
    sync: str = "sync"
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
        """The cost model of this run's profile (compute must be calibrated or given), with
        the overhead terms given here in place of the profile's."""
        network = get_profile(self.profile).with_overhead(
            None if self.overhead is None else self.overhead * 1e3,
            None if self.overhead_per_rank is None else self.overhead_per_rank * 1e3)
        return CostModel(
            network=network,
            n_params=n_params,
            compute_per_example=self.compute_per_example or 0.0,
            compute_fixed=self.compute_fixed or 0.0,
            forward_per_example=self.compute_forward_per_example,
            forward_fixed=self.compute_forward_fixed or 0.0,
            compute_norm=self.compute_norm or 0.0,
            micro_batch=self.micro_batch_size,
        )

    @property
    def micro_batch_size(self) -> int:
        """Examples per forward+backward pass (``micro_batch``, default ``per_worker_batch``)."""
        return int(self.micro_batch or self.per_worker_batch)

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
        for name in ("lr", "max_epochs", "eval_every", "timeout", "flush_seconds"):
            positive_float(name, getattr(self, name))
        if self.checkpoint_seconds is not None:
            positive_float("checkpoint_seconds", self.checkpoint_seconds,
                           "a positive number of seconds")
        for name in ("max_updates", "checkpoint_every", "micro_batch"):
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
        parse_device(self.device)
        get_profile(self.profile)
        if parse_sync(self.sync).kind == "ssp" and self.mode == "decentralized":
            raise ConfigError("sync", self.sync, "sync or backup:B with mode decentralized; "
                              "ssp:S runs in the parameter-server mode (mode centralized, or "
                              "local: its single-process reference)")
        for name in ("compute_per_example", "compute_fixed", "compute_forward_per_example",
                     "compute_forward_fixed", "compute_norm", "overhead", "overhead_per_rank"):
            if getattr(self, name) is not None:
                non_negative_float(name, getattr(self, name), "a non-negative number of seconds")
        non_negative_float("eval_resolution", self.eval_resolution,
                           "a fraction >= 0 (0.02: evaluations 2 % apart in examples seen)")
        non_negative_float("eval_dense_margin", self.eval_dense_margin,
                           "an accuracy margin >= 0 (0.06: every update within 6 points)")
        if self.max_time_sim is not None:
            positive_float("max_time_sim", self.max_time_sim, "a positive number of seconds")
        if self.target_accuracy is not None:
            number_in("target_accuracy", self.target_accuracy, 0, 1, "an accuracy in (0, 1]")
        choice("backend", self.backend, BACKENDS)
        for name in ("share_gpus", "eval_flush", "eval_checks"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "True or False")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError("backend", self.backend, "'auto' or 'gloo' with device='cpu'")


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


def training_digest(config: TrainConfig) -> str:
    """A digest of everything in ``config`` that decides a run's updates, evaluations and
    simulated time, except its network's size (:data:`SIZE_FIELDS`). Two runs with one
    digest, on the same data, train the same, update by update, on any two networks whose caps
    are at least the run's :func:`least_cap`. The data is not in it (nor ``n_train``, set from
    the data); the compute calibration is, so it must be resolved first."""
    fields = {k: v for k, v in dataclasses.asdict(config).items()
              if k not in SIZE_FIELDS and k != "n_train"
              and not (k == "sync" and v == "sync")}  # the digests of runs before ``sync``
    text = json.dumps(fields, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def least_cap(config: TrainConfig, history: list[dict[str, Any]]) -> int | None:
    """The least ``max_batch_size`` under which a run of ``config`` trains as ``history`` did:
    the largest damping of its updates, which its own cap never cut (a learning-rate-only
    damper's cap is its initial batch, whatever ``max_batch_size``). None when the run's cap
    did cut a damping (a larger network would have trained a larger batch) or it has no
    updates."""
    dampings = [int(r["damping"]) for r in history if r["kind"] == "update"]
    if not dampings:
        return None
    damper = config.make_damper()
    if damper.lr_only:
        return int(damper.initial)
    top = max(dampings)
    return top if top <= config.max_batch_size else None
