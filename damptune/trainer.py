"""The driver: setup → resume → loop over boundaries (checkpoint) → teardown.

Example:
    >>> import numpy as np
    >>> from damptune.config import TrainConfig
    >>> from damptune.state import TrainData
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 2, 64)
    >>> cfg = TrainConfig(module="torch.nn:Linear", module_kwargs={"in_features": 4,
    ...     "out_features": 2}, max_batch_size=32, max_epochs=1, damper_kwargs={"initial": 16})
    >>> state = train(cfg, TrainData.from_arrays(X, y, X, y))
    >>> state.update, state.examples_seen
    (4, 64)
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from damptune import interrupt
from damptune.centralized import CentralizedOps
from damptune.checkpoint import load_latest, save_checkpoint
from damptune.cluster import connect, scatter_data, worker_addresses
from damptune.config import TrainConfig
from damptune.decentralized import DecentralizedRunner
from damptune.errors import ConfigError, StopTraining
from damptune.loop import (
    CHECKPOINT,
    DONE,
    FLUSH,
    INTERRUPTED,
    MAX_UPDATES,
    Emit,
    LocalOps,
    Ops,
    advance,
    shard_forward,
)
from damptune.netmodel import calibrate_compute
from damptune.state import GLOBAL_RNG_LOCK, TrainData, TrainState, resolve_device

__all__ = ["train", "calibrate", "Callback"]

Callback = Callable[[dict[str, Any]], Any]


class _OpsRunner:
    """Runs the loop in this process with the given ops (local and centralized modes)."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops

    def advance(self, state: TrainState, emit: Emit,
                should_stop: Callable[[], bool] | None = None) -> str:
        return advance(state, self.ops, emit=emit, should_stop=should_stop)

    def sync(self, state: TrainState) -> None:
        """The state is this process's already."""

    def close(self, state: TrainState) -> None:
        close = getattr(self.ops, "close", None)
        if close is not None:
            close()


def check_data(config: TrainConfig, data: TrainData) -> None:
    if len(data.X) != len(data.y):
        raise ConfigError("y", f"{len(data.y)} labels", f"one label per example ({len(data.X)})")
    if len(data.y) == 0:
        raise ConfigError("X", "an empty training set", "at least one example")
    if config.n_train != len(data.y):
        raise ConfigError("n_train", config.n_train, f"the number of examples ({len(data.y)})")


def calibrate(config: TrainConfig, data: TrainData, state: TrainState) -> None:
    """Measure one rank's forward+backward time (single-threaded, as ranks run) on a copy of
    the model; store it in ``config`` (cached per model, device and batch sizes)."""
    model = copy.deepcopy(state.model)
    X, y = data.X.to(state.device), data.y.to(state.device)
    n = len(y)

    def step(size: int) -> None:
        shard_forward(model, X, y, np.arange(min(size, n)), grad=True)
        if state.device.type == "cuda":
            torch.cuda.synchronize()

    # it draws nothing, but saves and restores the process's shared generator
    with GLOBAL_RNG_LOCK:
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        torch.set_num_threads(1)
        try:
            key = "|".join([config.module, repr(sorted(config.module_kwargs.items())),
                            str(state.device), f"x{tuple(data.X.shape[1:])}"])
            sizes = (min(n, config.per_worker_batch), min(n, 4 * config.per_worker_batch))
            config.compute_fixed, config.compute_per_example = calibrate_compute(
                key, step, batch_sizes=sizes)
        finally:
            torch.set_num_threads(threads)
            torch.set_rng_state(rng)


def train(
    config: TrainConfig,
    data: TrainData,
    *,
    state: TrainState | None = None,
    callback: Callback | None = None,
    checkpoint_path: str | None = None,
    resume: bool = False,
    cluster: Any = None,
    workers: list[str] | None = None,
    local_directory: str | None = None,
    should_stop: Callable[[], str | None] | None = None,
    deadline: float | None = None,
) -> TrainState:
    """Train until ``max_epochs`` (or ``max_updates``) and return the final state.

    Args:
        config: the run's configuration (``n_train`` 0 means: take it from ``data``).
        data: training and evaluation tensors.
        state: continue this in-memory state instead of starting fresh.
        callback: called with every progress record (``kind`` update or eval, and one
            ``resume`` record first when training continues a checkpoint); it may raise
            :class:`StopTraining` to end training early.
        checkpoint_path: local path or fsspec URL; written every ``checkpoint_every`` updates
            and at the end.
        resume: continue from ``checkpoint_path`` when it exists.
        cluster: None (local Dask cluster of ``max_workers``), an address, a Client or a cluster.
        workers: addresses of the Dask workers this run may use (rank r on the r-th); default
            all of the cluster's. Lets several runs share one cluster without sharing workers.
        local_directory: Dask scratch directory for a cluster started here.
        should_stop: asked between updates; a reason (str) makes training checkpoint and stop
            *interrupted* (``state.interrupted``), to be continued by a rerun with ``resume``.
            A SIGTERM (:mod:`damptune.interrupt`) does the same.
        deadline: a ``time.time()`` after which training checkpoints and stops interrupted
            (a spot cluster's end of life, less a margin).
    """
    # setup: every check before any work and before touching an existing checkpoint
    if config.n_train == 0:
        config.n_train = len(data.y)
    config.validate()
    check_data(config, data)
    ckpt = None
    if resume and checkpoint_path:
        ckpt = load_latest(checkpoint_path, keep=config.checkpoint_keep)
    if ckpt is not None and config.compute_per_example is None:
        # keep the calibration the run started with, so its simulated time stays continuous
        config.compute_per_example = ckpt["config"].get("compute_per_example")
        config.compute_fixed = ckpt["config"].get("compute_fixed")
    resumed = False
    if state is None:
        state = TrainState(config, device=resolve_device(config))
        if ckpt is not None:
            state.restore(ckpt)  # raises CheckpointError if it belongs to another run
            resumed = True
    elif config.compute_per_example is None:
        config.compute_per_example = state.config.compute_per_example
        config.compute_fixed = state.config.compute_fixed
    if config.compute_per_example is None:
        calibrate(config, data, state)
    state.config = config
    state.stopped, state.interrupted = None, False

    def stop_reason() -> str | None:
        reason = interrupt.requested() or (should_stop() if should_stop else None)
        if reason is None and deadline is not None and time.time() >= deadline:
            reason = "the cluster's lifetime limit is near"
        return reason

    saved_at: list[tuple[int, int]] = []

    def save() -> None:
        mark = (state.update, len(state.history))
        if checkpoint_path and (not saved_at or saved_at[-1] != mark):  # no duplicate generation
            save_checkpoint(checkpoint_path, state.checkpoint(), keep=config.checkpoint_keep)
            saved_at.append(mark)
        state.checkpoint_clock = time.monotonic()

    def emit(record: dict[str, Any]) -> None:
        if callback is not None:
            callback(dict(record))

    if resumed:  # told to the callback only: the history stays that of an unbroken run
        emit({"kind": "resume", "update": state.update, "epoch": state.epoch,
              "examples_seen": state.examples_seen, "time_elapsed": state.time_elapsed,
              "time_sim": state.time_sim})

    with contextlib.ExitStack() as stack:
        if config.mode == "local":
            runner: Any = _OpsRunner(LocalOps(state.model, data.to(state.device)))
        else:
            client = stack.enter_context(
                connect(cluster, n_workers=config.max_workers, local_directory=local_directory)
            )
            known = worker_addresses(client)
            if workers is not None and not set(workers) <= set(known):
                raise ConfigError("workers", sorted(set(workers) - set(known)),
                                  f"addresses of the cluster's workers: {known}")
            workers = list(workers) if workers is not None else known
            data_future = scatter_data(client, data)
            if config.mode == "centralized":
                runner = _OpsRunner(CentralizedOps(
                    client=client, model=state.model, config=config, data=data,
                    data_future=data_future, workers=workers,
                ))
            else:
                runner = DecentralizedRunner(
                    client=client, config=config, data=data, data_future=data_future,
                    workers=workers,
                )
        # loop: run to the next boundary; checkpoint there
        try:
            with interrupt.active():
                while True:
                    reason = runner.advance(state, emit,
                                            should_stop=lambda: stop_reason() is not None)
                    if reason == FLUSH and stop_reason() is not None:
                        runner.sync(state)  # decentralized: the driver stops between segments
                        reason = INTERRUPTED
                    if reason == CHECKPOINT:
                        save()
                    if reason == INTERRUPTED:
                        state.interrupted = True
                        state.stopped = f"interrupted: {stop_reason()}"
                    if reason in (DONE, MAX_UPDATES, INTERRUPTED):
                        break
        except StopTraining as exc:
            state.stopped = str(exc) or "stopped by the callback"
        finally:
            runner.close(state)
    # teardown
    save()
    return state
