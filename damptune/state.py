"""Training state: model, optimizer, damper, sampler and counters, and its checkpoint dict."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from damptune.config import TrainConfig, resolve
from damptune.dampers import Damper, Step
from damptune.devices import this_process_device
from damptune.errors import CheckpointError
from damptune.sampler import EpochSampler
from damptune.tolerance import SspClock

__all__ = ["TrainData", "TrainState", "build_model", "resolve_device", "CHECKPOINT_FORMAT",
           "GLOBAL_RNG_LOCK"]

# torch's default generator is one per process. Runs that train in threads of one process (the
# cells of a grid) must not interleave its use: one run seeding it while another draws from it,
# or restores a saved state, would change the other's initial weights. Hold this lock around
# any seed → draw → restore sequence on the default generator.
GLOBAL_RNG_LOCK = threading.RLock()

CHECKPOINT_FORMAT = 1


@dataclass
class TrainData:
    """Training and evaluation tensors (CPU); they travel to each worker once per cluster."""

    X: torch.Tensor
    y: torch.Tensor
    X_test: torch.Tensor | None = None
    y_test: torch.Tensor | None = None

    @classmethod
    def from_arrays(cls, X: Any, y: Any, X_test: Any = None, y_test: Any = None) -> TrainData:
        def feats(a: Any) -> torch.Tensor | None:
            return None if a is None else torch.as_tensor(np.asarray(a), dtype=torch.float32)

        def labels(a: Any) -> torch.Tensor | None:
            return None if a is None else torch.as_tensor(np.asarray(a), dtype=torch.int64)

        X_t, y_t = feats(X), labels(y)
        assert X_t is not None and y_t is not None
        return cls(X_t, y_t, feats(X_test), labels(y_test))

    def to(self, device: torch.device) -> TrainData:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        X, y = self.X.to(device), self.y.to(device)
        return TrainData(X, y, move(self.X_test), move(self.y_test))


def resolve_device(config: TrainConfig) -> torch.device:
    """The torch device of a run in this process (``local`` mode): ``auto`` picks CUDA when
    present. Ranks get theirs from the driver's placement (:mod:`damptune.devices`)."""
    return this_process_device(config.device)


def build_model(config: TrainConfig) -> nn.Module:
    """The model with its seeded initial weights (identical in every process and thread).

    The default generator's state is left as it was (other runs of the process may be using
    it)."""
    with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = resolve(config.module)(**config.module_kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(f"module={config.module!r} built a {type(model).__name__}, not a Module")
    return model


class TrainState:
    """All that changes during training, with an exact checkpoint round trip."""

    def __init__(self, config: TrainConfig, *, device: torch.device | None = None) -> None:
        self.config = config
        self.device = device or torch.device("cpu")
        self.model = build_model(config).to(self.device)
        opt_cls = resolve(config.optimizer)
        self.optimizer: torch.optim.Optimizer = opt_cls(
            self.model.parameters(), lr=config.lr, **config.optimizer_kwargs
        )
        self.damper: Damper = config.make_damper()
        self.sampler = EpochSampler(config.n_train, seed=config.seed)
        self.update = 0  # model updates done
        self.examples_seen = 0
        self.next_eval = 1  # index of the next evaluation point (multiples of eval_every)
        self.last_loss: float | None = None
        self.last_grad_sq_norm: float | None = None
        self.pending_step: Step | None = None  # planned but not yet applied (resize boundary)
        # the damper's own work for the pending step (AdaDamp's loss pass): examples, seconds
        self.pending_damper_examples = 0
        self.pending_damper_seconds = 0.0
        self.last_eval_examples = 0  # examples seen at the last evaluation (eval_resolution)
        self.last_eval_accuracy = 0.0  # its test accuracy (eval_dense_margin)
        self.best_accuracy = 0.0  # the best test accuracy of any evaluation so far
        self.target_reached = False  # an evaluation reached config.target_accuracy: done
        self.time_elapsed = 0.0  # measured seconds of training so far, across resumes
        self.time_sim = 0.0  # simulated seconds on the configured network profile
        self.history: list[dict[str, Any]] = []
        self.stopped: str | None = None
        self.interrupted = False  # stopped to be continued (SIGTERM, lifetime), not failed
        self.checkpoint_clock = time.monotonic()  # when the last checkpoint was written
        self.preempted = False  # one of the run's workers got a preemption notice: checkpoint
        # sync "ssp:S" (damptune.tolerance): the simulated clocks, and the last S + 1 weight
        # versions (flat, the newest last) that stale gradients are computed on
        self.ssp_clock = SspClock()
        self.weight_versions: list[torch.Tensor] = []

    @property
    def epoch(self) -> float:
        return self.examples_seen / self.config.n_train

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def finished(self) -> bool:
        return self.target_reached or (
            self.examples_seen >= self.config.max_epochs * self.config.n_train)

    # -- checkpoint -------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        """One dict with everything exact continuation needs (loadable with weights_only)."""
        step = self.pending_step
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.config.to_dict(),
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": _to_cpu(self.optimizer.state_dict()),
            "damper": dict(self.damper.state_dict()),
            "sampler": self.sampler.state_dict(),
            "counters": {
                "update": self.update,
                "examples_seen": self.examples_seen,
                "next_eval": self.next_eval,
                "last_loss": self.last_loss,
                "last_grad_sq_norm": self.last_grad_sq_norm,
                "time_elapsed": self.time_elapsed,
                "time_sim": self.time_sim,
                "pending_damper_examples": self.pending_damper_examples,
                "pending_damper_seconds": self.pending_damper_seconds,
                "last_eval_examples": self.last_eval_examples,
                "last_eval_accuracy": self.last_eval_accuracy,
                "best_accuracy": self.best_accuracy,
                "target_reached": self.target_reached,
                "pending_step": None
                if step is None
                else {"damping": step.damping, "batch_size": step.batch_size, "lr": step.lr},
            },
            "rng": {
                "torch": torch.get_rng_state(),
                "python": list(random.getstate()[1]),
            },
            "history": [dict(r) for r in self.history],
            **({"ssp": {**self.ssp_clock.state_dict(),
                        "versions": [v.detach().cpu().clone() for v in self.weight_versions]}}
               if self.weight_versions else {}),
        }

    def restore(self, ckpt: dict[str, Any]) -> None:
        """Continue from a checkpoint dict; raises CheckpointError if it is not ours."""
        check_compatible(self.config, ckpt)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.damper.load_state_dict(ckpt["damper"])
        self.sampler.load_state_dict(ckpt["sampler"])
        c = ckpt["counters"]
        self.update, self.examples_seen = int(c["update"]), int(c["examples_seen"])
        self.next_eval = int(c["next_eval"])
        self.last_loss, self.last_grad_sq_norm = c["last_loss"], c["last_grad_sq_norm"]
        self.time_elapsed = float(c["time_elapsed"])
        self.time_sim = float(c["time_sim"])
        self.pending_damper_examples = int(c.get("pending_damper_examples", 0))
        self.pending_damper_seconds = float(c.get("pending_damper_seconds", 0.0))
        self.last_eval_examples = int(c.get("last_eval_examples", 0))
        self.last_eval_accuracy = float(c.get("last_eval_accuracy", 0.0))
        self.best_accuracy = float(c.get("best_accuracy", 0.0))
        self.target_reached = bool(c.get("target_reached", False))
        ps = c["pending_step"]
        self.pending_step = None if ps is None else Step(**ps)
        with GLOBAL_RNG_LOCK:
            torch.set_rng_state(ckpt["rng"]["torch"])
        state = random.getstate()
        random.setstate((state[0], tuple(ckpt["rng"]["python"]), state[2]))
        if "history" in ckpt:  # ranks get checkpoints without it; the driver keeps it
            self.history = [dict(r) for r in ckpt["history"]]
        ssp = ckpt.get("ssp")
        if ssp is not None:
            self.ssp_clock = SspClock(list(ssp["finish"]), list(ssp["applied"]))
            device = next(self.model.parameters()).device
            self.weight_versions = [v.to(device) for v in ssp["versions"]]


def check_compatible(config: TrainConfig, ckpt: dict[str, Any]) -> None:
    """Raise CheckpointError naming every identity field that differs."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        got = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(
            f"checkpoint format {got!r} is not supported; expected format {CHECKPOINT_FORMAT}"
        )
    saved = TrainConfig.from_dict(ckpt["config"]).identity()
    wanted = config.identity()
    diffs = [f"{k}: checkpoint has {saved[k]!r}, run has {wanted[k]!r}"
             for k in wanted if saved.get(k) != wanted[k]]
    if diffs:
        raise CheckpointError(
            "the checkpoint belongs to another model or configuration ("
            + "; ".join(diffs)
            + "). Use another checkpoint path or the checkpoint's configuration; "
            "the existing checkpoint was left untouched."
        )


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
