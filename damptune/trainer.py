"""The driver: setup → resume → loop over boundaries (checkpoint) → teardown.

Example:
    >>> import numpy as np
    >>> from damptune.config import CALIBRATION_FIELDS, TrainConfig
from damptune.devices import place_ranks, worker_report
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
import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from damptune import interrupt
from damptune.checkpoint import load_latest, save_checkpoint
from damptune.cluster import (
    ClusterWorkers,
    WorkerGroup,
    connect,
    gather_within,
    scheduler_address,
    worker_addresses,
)
from damptune.config import CALIBRATION_FIELDS, TrainConfig
from damptune.devices import place_ranks, worker_report
from damptune.errors import ClusterError, ConfigError, StopTraining
from damptune.loop import (
    CHECKPOINT,
    DONE,
    FLUSH,
    INTERRUPTED,
    MAX_TIME_SIM,
    MAX_UPDATES,
    TARGET,
    Emit,
    LocalOps,
    Ops,
    advance,
    shard_forward,
)
from damptune.netmodel import calibrate_compute
from damptune.preemption import PreemptionWatch
from damptune.records import Record, ResumeRecord
from damptune.segments import SegmentRunner
from damptune.state import GLOBAL_RNG_LOCK, TrainData, TrainState, build_model, resolve_device

__all__ = ["train", "calibrate", "with_calibration", "Callback", "Runner", "STOPPED_BY_BOUND"]

Callback = Callable[[Record], Any]
StopReason = Callable[[], str | None]


class Runner(Protocol):
    """Where the update loop runs: in this process (``local``) or on the ranks (the
    data-parallel modes). ``advance`` runs updates until a boundary and says why."""

    def advance(self, state: TrainState, emit: Emit,
                should_stop: Callable[[], bool] | None = None) -> str:
        """Run updates until training ends or a boundary the driver must handle."""
        ...

    def sync(self, state: TrainState) -> None:
        """Bring ``state`` up to date with the ranks (after a stop between segments)."""
        ...

    def close(self, state: TrainState) -> None:
        """Release the ranks."""
        ...


class _OpsRunner:
    """Runs the loop in this process with the given ops (``local`` mode)."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops

    def advance(self, state: TrainState, emit: Emit,
                should_stop: Callable[[], bool] | None = None) -> str:
        return advance(state, self.ops, emit=emit, should_stop=should_stop)

    def sync(self, state: TrainState) -> None:
        """The state is this process's already."""

    def close(self, state: TrainState) -> None:
        """Nothing to release."""


def check_data(config: TrainConfig, data: TrainData) -> None:
    if len(data.X) != len(data.y):
        raise ConfigError("y", f"{len(data.y)} labels", f"one label per example ({len(data.X)})")
    if len(data.y) == 0:
        raise ConfigError("X", "an empty training set", "at least one example")
    if config.n_train != len(data.y):
        raise ConfigError("n_train", config.n_train, f"the number of examples ({len(data.y)})")


def _with_n_train(config: TrainConfig, data: TrainData) -> TrainConfig:
    """``config`` with ``n_train`` taken from ``data`` where it is 0 (a copy; never changed)."""
    return dataclasses.replace(config, n_train=config.n_train or len(data.y))


def calibrate(config: TrainConfig, data: TrainData, *, client: Any = None,
              worker: str | None = None) -> TrainConfig:
    """A copy of ``config`` with ``n_train`` from ``data`` and the compute calibration
    (:data:`~damptune.config.CALIBRATION_FIELDS`: one rank's forward+backward, forward alone
    and gradient norm, single-threaded) measured when ``compute_per_example`` is not given.
    ``config`` itself is not changed. Measured in this process, or, for ranks on GPUs
    (``device`` not ``cpu`` in a distributed mode) with a Dask ``client`` and a ``worker``
    address, on that worker's GPU, where ranks train (this process may have none).

    Example:
        >>> import numpy as np
        >>> X, y = np.zeros((8, 4), "float32"), np.zeros(8, "int64")
        >>> cfg = TrainConfig(module="torch.nn:Linear", module_kwargs={"in_features": 4,
        ...     "out_features": 2}, compute_per_example=1e-4, compute_fixed=0.0)
        >>> calibrate(cfg, TrainData.from_arrays(X, y)).n_train, cfg.n_train
        (8, 0)
    """
    config = _with_n_train(config, data)
    if config.compute_per_example is not None:
        return config
    if client is not None and worker is not None and _on_workers(config):
        return _measure_on(client, worker, config, data)
    device = resolve_device(config)
    return _measure(config, data, build_model(config).to(device), device)


def _on_workers(config: TrainConfig) -> bool:
    """Compute is measured where the ranks train: on a worker's GPU (else here, on CPU)."""
    return config.mode != "local" and config.device != "cpu"


def _measure_on(client: Any, worker: str, config: TrainConfig, data: TrainData) -> TrainConfig:
    """``_measure`` on ``worker``, on the device a rank there gets, with the examples the
    measurement uses (the first ``4 × per_worker_batch``)."""
    n = min(len(data.y), 4 * config.per_worker_batch)
    sample = TrainData(data.X[:n].clone(), data.y[:n].clone())
    future = client.submit(_measure_here, config, sample, workers=[worker],
                           allow_other_workers=False, pure=False)
    measured: TrainConfig = gather_within([future], timeout=config.timeout,
                                          what="measuring compute on a worker")[0]
    return measured


def _measure_here(config: TrainConfig, sample: TrainData) -> TrainConfig:
    """On a Dask worker: the calibration on the GPU a single rank there gets."""
    device = torch.device(place_ranks(config.device, [worker_report()],
                                      backend="gloo").devices[0])
    return _measure(config, sample, build_model(config).to(device), device)


def _measure(config: TrainConfig, data: TrainData, model: torch.nn.Module,
             device: torch.device) -> TrainConfig:
    """``config`` with one rank's compute measured on ``model`` (its gradients are
    overwritten, its weights untouched): forward+backward, forward alone (the damper's loss
    pass) and the gradient's squared norm; cached per model, device and batch sizes."""
    X, y = data.X.to(device), data.y.to(device)
    n = len(y)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(size: int, grad: bool = True) -> None:
        shard_forward(model, X, y, np.arange(min(size, n)), grad=grad, micro_batch=None)
        sync()

    def norm(size: int) -> None:
        torch._foreach_norm([p.grad for p in model.parameters() if p.grad is not None])
        sync()

    # it draws nothing, but saves and restores the process's shared generator
    with GLOBAL_RNG_LOCK:
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        torch.set_num_threads(1)
        try:
            key = "|".join([config.module, repr(sorted(config.module_kwargs.items())),
                            str(device), f"x{tuple(data.X.shape[1:])}"])
            sizes = (min(n, config.per_worker_batch), min(n, 4 * config.per_worker_batch))
            fixed, per_example = calibrate_compute(key, step, batch_sizes=sizes)
            fwd_fixed, fwd_per_example = calibrate_compute(
                key + "|forward", lambda size: step(size, grad=False), batch_sizes=sizes)
            step(sizes[0])  # gradients for the norm
            _, norm_seconds = calibrate_compute(key + "|norm", norm, batch_sizes=(1,))
        finally:
            torch.set_num_threads(threads)
            torch.set_rng_state(rng)
    return dataclasses.replace(
        config, compute_fixed=fixed, compute_per_example=per_example,
        compute_forward_fixed=fwd_fixed, compute_forward_per_example=fwd_per_example,
        compute_norm=norm_seconds)


def with_calibration(config: TrainConfig, source: dict[str, Any]) -> TrainConfig:
    """``config`` with the compute calibration of ``source`` (a configuration's dict)."""
    out = dataclasses.replace(config)
    for name in CALIBRATION_FIELDS:
        setattr(out, name, source.get(name))
    return out


def _resume_record(state: TrainState) -> ResumeRecord:
    return ResumeRecord(update=state.update, epoch=state.epoch,
                        examples_seen=state.examples_seen, time_elapsed=state.time_elapsed,
                        time_sim=state.time_sim)


def train(
    config: TrainConfig,
    data: TrainData,
    *,
    state: TrainState | None = None,
    callback: Callback | None = None,
    checkpoint_path: str | None = None,
    resume: bool = False,
    cluster: Any = None,
    workers: list[str] | WorkerGroup | None = None,
    local_directory: str | None = None,
    should_stop: Callable[[], str | None] | None = None,
    deadline: float | None = None,
) -> TrainState:
    """Train until ``max_epochs`` (or ``max_updates``) and return the final state.

    ``config`` is not changed: the resolved configuration (``n_train``, the compute
    calibration) is ``state.config``.

    Args:
        config: the run's configuration (``n_train`` 0 means: take it from ``data``).
        data: training and evaluation tensors.
        state: continue this in-memory state instead of starting fresh.
        callback: called with every progress record (:mod:`damptune.records`: an
            ``UpdateRecord`` or ``EvalRecord``, and one ``ResumeRecord`` first when training
            continues a checkpoint); it may raise :class:`StopTraining` to end training early.
        checkpoint_path: local path or fsspec URL; written every ``checkpoint_every`` updates
            and at the end.
        resume: continue from ``checkpoint_path`` when it exists.
        cluster: None (local Dask cluster of ``max_workers``), an address, a Client or a cluster.
        workers: the Dask workers this run may use (rank r on the r-th): addresses, or a
            :class:`~damptune.cluster.WorkerGroup` that also says which workers replace lost
            ones (several runs sharing one cluster); default all of the cluster's, replaced
            by workers that join later.
        local_directory: Dask scratch directory for a cluster started here.
        should_stop: asked between updates; a reason (str) makes training checkpoint and stop
            *interrupted* (``state.interrupted``), to be continued by a rerun with ``resume``.
            A SIGTERM (:mod:`damptune.interrupt`) does the same.
        deadline: a ``time.time()`` after which training checkpoints and stops interrupted
            (a spot cluster's end of life, less a margin). Due before training would begin
            (or a stop asked then): nothing is trained; interrupted where it started.
    """
    # setup: every check before any work and before touching an existing checkpoint
    config = _with_n_train(config, data)
    config.validate()
    check_data(config, data)
    # resume
    state, resumed = _start(config, data, state, checkpoint_path if resume else None)
    emit: Emit = callback if callback is not None else (lambda record: None)
    if resumed:  # told to the callback only: the history stays that of an unbroken run
        emit(_resume_record(state))
    checkpoints = _Checkpoints(checkpoint_path, keep=state.config.checkpoint_keep)
    # loop
    with contextlib.ExitStack() as stack:
        runner, notices = _open_runner(stack, state, data, cluster=cluster, workers=workers,
                                       local_directory=local_directory)
        _run(state, runner, emit, _stop_reason(should_stop, deadline), checkpoints, notices)
    # teardown
    checkpoints.save(state)
    return state


def _start(config: TrainConfig, data: TrainData, state: TrainState | None,
           checkpoint_path: str | None) -> tuple[TrainState, bool]:
    """The state to train (fresh, the given one, or the checkpoint's) with its resolved
    configuration; True if it continues a checkpoint. The one place where runs resume."""
    ckpt = load_latest(checkpoint_path, keep=config.checkpoint_keep) if checkpoint_path else None
    if ckpt is not None and config.compute_per_example is None:
        # keep the calibration the run started with, so its simulated time stays continuous
        config = with_calibration(config, ckpt["config"])
    resumed = False
    if state is None:  # the driver of ranks only holds the state between segments: on CPU
        state = TrainState(config, device=resolve_device(config) if config.mode == "local"
                           else torch.device("cpu"))
        if ckpt is not None:
            state.restore(ckpt)  # raises CheckpointError if it belongs to another run
            resumed = True
    elif config.compute_per_example is None:
        config = with_calibration(config, state.config.to_dict())
    if config.compute_per_example is None and not _on_workers(config):
        config = _measure(config, data, copy.deepcopy(state.model), state.device)
    state.config = config  # on workers: measured in _open_runner, on rank 0's worker
    state.stopped, state.interrupted = None, False
    return state, resumed


def _stop_reason(should_stop: Callable[[], str | None] | None,
                 deadline: float | None) -> StopReason:
    """Why training must stop now (a SIGTERM, the caller, the cluster's deadline), or None."""

    def reason() -> str | None:
        found = interrupt.requested() or (should_stop() if should_stop else None)
        if found is None and deadline is not None and time.time() >= deadline:
            found = "the cluster's lifetime limit is near"
        return found

    return reason


class _Checkpoints:
    """Writes the state's checkpoint (never the same generation twice) and restarts the
    checkpoint clock."""

    def __init__(self, path: str | None, *, keep: int) -> None:
        self.path, self.keep = path, keep
        self.saved_at: tuple[int, int] | None = None

    def save(self, state: TrainState) -> None:
        mark = (state.update, len(state.history))
        if self.path and self.saved_at != mark:
            save_checkpoint(self.path, state.checkpoint(), keep=self.keep)
            self.saved_at = mark
        state.checkpoint_clock = time.monotonic()


def _open_runner(stack: contextlib.ExitStack, state: TrainState, data: TrainData, *,
                 cluster: Any, workers: list[str] | WorkerGroup | None,
                 local_directory: str | None) -> tuple[Runner, _Notices]:
    """The runner of the configured mode (its Dask client closes with ``stack``) and the
    preemption notices of its workers."""
    if state.config.mode == "local":
        ops = LocalOps(state.model, data.to(state.device), micro_batch=state.config.micro_batch)
        return _OpsRunner(ops), _Notices(None, None)
    config = state.config
    client = stack.enter_context(
        connect(cluster, n_workers=config.max_workers, local_directory=local_directory))
    group = workers if isinstance(workers, WorkerGroup) else ClusterWorkers(
        client, list(workers) if workers is not None else worker_addresses(client))
    missing = sorted(set(group.addresses) - set(worker_addresses(client)))
    if missing:  # it left between being chosen and now: a fault of the cluster, not the input
        raise ClusterError(f"worker(s) {missing} are no longer in the cluster at "
                           f"{scheduler_address(client)}")
    if config.compute_per_example is None:  # where rank 0 will train
        config = state.config = _measure_on(client, group.addresses[0], config, data)
    watch = PreemptionWatch(client)
    stack.callback(watch.close)
    runner = SegmentRunner(client=client, config=config, data=data, group=group)
    return runner, _Notices(watch, group)


class _Notices:
    """Preemption notices for the workers the run uses or used (the group may have replaced
    the worker before its notice arrived); none in ``local`` mode."""

    def __init__(self, watch: PreemptionWatch | None, group: WorkerGroup | None) -> None:
        self.watch, self.group = watch, group
        self.used: set[str] = set(group.addresses) if group is not None else set()

    def pending(self) -> bool:
        if self.watch is None or self.group is None:
            return False
        self.used |= set(self.group.addresses)
        return bool(set(self.watch.take()) & self.used)


# training ended before its budget for a reason of the configuration: state.stopped says it
STOPPED_BY_BOUND = "the simulated-time budget (max_time_sim) was spent"
_ENDINGS = {TARGET: "the target accuracy was reached", MAX_TIME_SIM: STOPPED_BY_BOUND}


def _run(state: TrainState, runner: Runner, emit: Emit, stop_reason: StopReason,
         checkpoints: _Checkpoints, notices: _Notices) -> None:
    """Run to each boundary; checkpoint there (and at the first boundary after one of the
    run's workers got a preemption notice); stop when training is over, interrupted, or
    stopped by the callback (``state.stopped`` says why)."""

    def should_stop() -> bool:
        if notices.pending():  # checkpoint at the next update: the loop sees the clock due
            state.checkpoint_clock, state.preempted = float("-inf"), True
        return stop_reason() is not None

    try:
        with interrupt.active():
            due = stop_reason()  # before the first segment: a due stop trains nothing (the
            if due is not None:  # ranks would train a segment, ~1 s, in which a trial may end)
                state.interrupted, state.stopped = True, f"interrupted: {due}"
                return
            while True:
                reason = runner.advance(state, emit, should_stop=should_stop)
                if reason == FLUSH and stop_reason() is not None:
                    runner.sync(state)  # ranks: the driver stops between segments
                    reason = INTERRUPTED
                if reason == FLUSH and (state.preempted or notices.pending()):
                    # ranks keep the checkpoint clock; save between segments
                    runner.sync(state)
                    reason = CHECKPOINT
                if reason == CHECKPOINT:
                    state.preempted = False
                    checkpoints.save(state)
                    if stop_reason() is not None:  # ranks: asked at every boundary
                        reason = INTERRUPTED
                if reason == INTERRUPTED:
                    state.interrupted = True
                    state.stopped = f"interrupted: {stop_reason()}"
                if reason in _ENDINGS:
                    state.stopped = _ENDINGS[reason]
                if reason in (DONE, MAX_UPDATES, INTERRUPTED, *_ENDINGS):
                    return
    except StopTraining as exc:
        state.stopped = str(exc) or "stopped by the callback"
    finally:
        runner.close(state)
