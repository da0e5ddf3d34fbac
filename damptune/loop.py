"""The update loop, shared by every mode.

It reads top to bottom: plan the update (damper → batch size, lr, ranks) → draw the batch →
gradient on the ranks (``ops``) → optimizer step → record → evaluate / checkpoint boundary.

What is charged to an update, in measured (``time_update``, ``time_elapsed``) and simulated
(``time_sim``) seconds: its gradient, exchange and step, and the damper's own work before it
(AdaDamp's loss pass over its subset: ``damper_examples``, ``time_damper``; RadaDamp's
gradient norm). Evaluation is measurement, not training: it is charged to neither clock.
Evaluations come every ``eval_every`` epochs; with ``eval_resolution`` r > 0, whenever the
examples seen have grown by the fraction r since the last one; and with ``eval_dense_margin``
m > 0, after every update while the last evaluation was within m below ``target_accuracy``.
With m > 0 and ``eval_checks``, an evaluation the ``eval_every`` schedule did not ask for
that lands more than m below the target is a check: it records nothing (it only says that no
update is evaluated densely yet) and, on the whole test set, stops as soon as that is certain.
Test accuracy is noisy (it can touch the target for one update and fall back), so a sparse
grid alone finds a later crossing than an evaluation after every update would; near the
target every update is evaluated, so the first crossing is found on its own update.
``ops`` decides where gradients are computed and who steps: this process (``local``), or the
ranks on Dask workers (:mod:`damptune.ranks`, where this loop runs on every rank), which
all-reduce and all step (``decentralized``) or reduce to a master that steps and broadcasts
its weights (``centralized``). ``gradient`` leaves the *sum* of per-example gradients in
``.grad``; ``step`` turns it into the mean and applies the optimizer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from damptune.arrivals import arrived, gradient, keep_version
from damptune.config import n_workers_for
from damptune.dampers import Progress, Step
from damptune.netmodel import CostModel
from damptune.records import EvalRecord, Record, UpdateRecord
from damptune.sampler import split_shares
from damptune.state import TrainData, TrainState

__all__ = ["Ops", "LocalOps", "StepHere", "advance", "optimizer_step", "shard_forward",
           "shard_evaluate", "evaluate_all", "Emit", "TARGET", "MAX_TIME_SIM"]

Emit = Callable[[Record], None]
# Why `advance` returned: training is over, or a boundary where the driver must act.
DONE, MAX_UPDATES, CHECKPOINT = "done", "max_updates", "checkpoint"
RESIZE, FLUSH, INTERRUPTED = "resize", "flush", "interrupted"
TARGET = "target"  # an evaluation reached config.target_accuracy: training is over
MAX_TIME_SIM = "max_time_sim"  # config.max_time_sim simulated seconds are spent: over
# flags a rank raises in the all-reduce (rank 0 decides; all ranks see the same sum)
FLAG_NONE, FLAG_FLUSH, FLAG_CHECKPOINT = 0, 1, 2


class Ops(Protocol):
    """Where gradients and losses are computed (one implementation per mode)."""

    @property
    def world_size(self) -> int | None:
        """The number of ranks P these ops train on now (ranks), None if any P works."""
        ...

    def gradient(self, shares: list[np.ndarray]) -> tuple[float, float, float, int]:
        """Sum-of-gradients into ``.grad``; returns (loss sum, compute s, comm s, flag)."""
        ...

    def step(self, optimizer: torch.optim.Optimizer, *, lr: float, batch_size: int,
             loss_sum: float, flag: int) -> tuple[float, float, int, float]:
        """Apply the update; (loss sum, squared gradient norm, flag, comm seconds) as every
        rank must see them."""
        ...

    def loss(self, shares: list[np.ndarray]) -> float:
        """Sum of training losses over the shares (no gradient)."""
        ...

    def evaluate(self, n_ranks: int, *, at_least: float | None = None
                 ) -> tuple[float, int, int] | None:
        """(loss sum, correct, count) on the evaluation set. With ``at_least``, it may stop
        and return None as soon as the accuracy is certain to be below it."""
        ...


def shard_forward(
    model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, idx: np.ndarray, *, grad: bool,
    micro_batch: int | None = None,
) -> float:
    """Sum of the cross-entropy losses of examples ``idx``; with ``grad`` its gradient is left
    in ``.grad`` (zeros for an empty shard). ``micro_batch``: at most that many examples per
    forward+backward pass, their gradients added up in ``.grad`` (the same sum, up to float
    summation order; memory for ``micro_batch`` examples, not ``len(idx)``); None: one pass."""
    model.zero_grad(set_to_none=False)
    if len(idx) == 0:
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return 0.0
    size = micro_batch or len(idx)
    total = torch.zeros((), dtype=torch.float64, device=X.device)
    for start in range(0, len(idx), size):
        index = torch.as_tensor(idx[start : start + size], device=X.device)
        with torch.set_grad_enabled(grad):
            loss = F.cross_entropy(model(X[index]), y[index], reduction="sum")
        if grad:
            loss.backward()
        total += loss.detach()
    return float(total)


def shard_evaluate(
    model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, rows: range, chunk: int = 256,
    *, at_least: float | None = None,
) -> tuple[float, int] | None:
    """(loss sum, number correct) over the consecutive examples ``rows``, in chunks: ``chunk``
    examples, then each chunk as many as all before it, up to 4 × ``chunk`` (few passes, an
    early first answer, and memory for at most 4 × ``chunk`` examples). With ``at_least``:
    None as soon as the accuracy over ``rows`` is certain to be below it (the wrong answers so
    far leave too few to reach it), so an accuracy below ``at_least`` is always found, early
    or at the end, by the same comparison."""
    loss_sum, correct, wrong, n = 0.0, 0, 0, len(rows)
    bounds = [0]
    while bounds[-1] < n:
        bounds.append(min(bounds[-1] + min(max(bounds[-1], chunk), 4 * chunk), n))
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start, stop in zip(bounds, bounds[1:], strict=False):
                chunk_rows = slice(rows.start + start, rows.start + stop)
                out, labels = model(X[chunk_rows]), y[chunk_rows]
                loss_sum += float(F.cross_entropy(out, labels, reduction="sum"))
                hits = int((out.argmax(1) == labels).sum())
                correct, wrong = correct + hits, wrong + len(labels) - hits
                if at_least is not None and (n - wrong) / n < at_least:
                    return None
    finally:
        model.train(was_training)
    return loss_sum, correct


def optimizer_step(optimizer: torch.optim.Optimizer, *, lr: float, batch_size: int) -> float:
    """Gradient sums -> means over the batch, then one step at ``lr``; the squared norm of
    the mean gradient."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
    torch._foreach_div_(grads, float(batch_size))  # sum -> mean over the batch
    grad_sq = float(torch.stack(torch._foreach_norm(grads)).square().sum())
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return grad_sq


class StepHere:
    """The optimizer steps in this process, on the gradients ``gradient`` left."""

    def step(self, optimizer: torch.optim.Optimizer, *, lr: float, batch_size: int,
             loss_sum: float, flag: int) -> tuple[float, float, int, float]:
        return loss_sum, optimizer_step(optimizer, lr=lr, batch_size=batch_size), flag, 0.0


class LocalOps(StepHere):
    """Everything in this process: the single-process reference the other modes must match."""

    world_size = None

    def __init__(self, model: torch.nn.Module, data: TrainData, *,
                 micro_batch: int | None = None) -> None:
        self.model, self.data, self.micro_batch = model, data, micro_batch

    def gradient(self, shares: list[np.ndarray]) -> tuple[float, float, float, int]:
        t0 = time.perf_counter()
        loss = shard_forward(self.model, self.data.X, self.data.y, np.concatenate(shares),
                             grad=True, micro_batch=self.micro_batch)
        return loss, time.perf_counter() - t0, 0.0, FLAG_NONE

    def loss(self, shares: list[np.ndarray]) -> float:
        idx = np.concatenate(shares)
        return shard_forward(self.model, self.data.X, self.data.y, idx, grad=False)

    def evaluate(self, n_ranks: int, *, at_least: float | None = None
                 ) -> tuple[float, int, int] | None:
        X, y = self.data.X_test, self.data.y_test
        if X is None or y is None:
            return float("nan"), 0, 0
        return evaluate_all(self.model, X, y, at_least=at_least)


def evaluate_all(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, *,
                 at_least: float | None = None) -> tuple[float, int, int] | None:
    """(loss sum, correct, count) over the whole evaluation set, in this process; None as
    soon as its accuracy is certain to be below ``at_least`` (:func:`shard_evaluate`)."""
    sums = shard_evaluate(model, X, y, range(len(y)), at_least=at_least)
    return None if sums is None else (*sums, len(y))


def train_loss_subset(state: TrainState) -> np.ndarray:
    """The fixed training subset on which AdaDamp measures F(w)."""
    cfg = state.config
    rng = np.random.default_rng([cfg.seed, 2**31 - 1])
    return rng.permutation(cfg.n_train)[: cfg.train_loss_examples].astype(np.int64)


def advance(
    state: TrainState,
    ops: Ops,
    *,
    emit: Emit,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """Run updates until training ends or a boundary the driver must handle; return why.

    ``should_stop`` is asked after every update (``local`` mode; the ranks of the other
    modes are stopped by the driver between segments).
    """
    cfg = state.config
    subset = train_loss_subset(state)
    cost = cfg.cost_model(state.n_params)
    while True:
        if state.finished():
            return TARGET if state.target_reached else DONE
        if cfg.max_updates is not None and state.update >= cfg.max_updates:
            return MAX_UPDATES
        if cfg.max_time_sim is not None and state.time_sim >= cfg.max_time_sim:
            return MAX_TIME_SIM
        step = plan(state, ops, subset)
        n_ranks = n_workers_for(step.batch_size, cfg)
        if ops.world_size is not None and n_ranks != ops.world_size:
            return RESIZE
        flag = apply_update(state, ops, step, n_ranks=n_ranks, cost=cost, emit=emit)
        reason = _boundary(state, ops, flag=flag, n_ranks=n_ranks, emit=emit,
                           should_stop=should_stop)
        if reason is not None:
            return reason


def plan(state: TrainState, ops: Ops, subset: np.ndarray) -> Step:
    """The next update's step: damping → batch size and lr (cap-then-decay); kept in
    ``state.pending_step`` until applied (a resize boundary may come in between)."""
    if state.pending_step is None:
        progress = Progress(
            update=state.update,
            epoch=state.epoch,
            examples_seen=state.examples_seen,
            loss=state.last_loss,
            grad_sq_norm=state.last_grad_sq_norm,
            train_loss=lambda: _damper_loss(state, ops, subset),
        )
        state.pending_step = state.damper.step(
            progress, lr0=state.config.lr, max_batch_size=state.config.max_batch_size
        )
    return state.pending_step


def _damper_loss(state: TrainState, ops: Ops, subset: np.ndarray) -> float:
    """F(w) on the fixed training subset, computed across the ranks: the damper's own work,
    charged to the update it plans (its seconds measured, its examples simulated)."""
    t0 = time.perf_counter()
    loss = ops.loss(split_shares(subset, _ranks(ops))) / len(subset)
    state.pending_damper_examples += len(subset)
    state.pending_damper_seconds += time.perf_counter() - t0
    return loss


def apply_update(state: TrainState, ops: Ops, step: Step, *, n_ranks: int, cost: CostModel,
                 emit: Emit) -> int:
    """One model update on ``n_ranks`` ranks (each sums the gradient over its share of the
    global batch); records and emits it; returns the ranks' flag."""
    t0 = time.perf_counter()
    indices = state.sampler.take(step.batch_size)
    keep_version(state)  # ssp: the weights this and later updates' gradients may be stale on
    got = arrived(state, split_shares(indices, n_ranks), cost, step.batch_size)
    used = sum(len(share) for share in got.shares)  # the examples whose gradients arrived
    loss_sum, t_compute, t_comm, flag = gradient(state, ops, got)
    loss_sum, grad_sq, flag, t_sync = ops.step(state.optimizer, lr=step.lr, batch_size=used,
                                               loss_sum=loss_sum, flag=flag)
    t_comm += t_sync
    damper_examples, t_damper = state.pending_damper_examples, state.pending_damper_seconds
    t_update = time.perf_counter() - t0 + t_damper

    state.pending_step = None
    state.pending_damper_examples, state.pending_damper_seconds = 0, 0.0
    state.update += 1
    state.examples_seen += used
    state.last_loss = loss_sum / used
    state.last_grad_sq_norm = grad_sq
    state.damper.observe(loss=state.last_loss, grad_sq_norm=grad_sq)
    state.time_elapsed += t_update
    state.time_sim += cost.update_seconds(batch_size=step.batch_size, n_ranks=n_ranks,
                                          damper_examples=damper_examples,
                                          norm=state.damper.uses_grad_norm, straggle=got.straggle)
    record = UpdateRecord(
        update=state.update, epoch=state.epoch, examples_seen=state.examples_seen,
        batch_size=step.batch_size, lr=step.lr, damping=step.damping, n_workers=n_ranks,
        loss=state.last_loss, grad_sq_norm=grad_sq, time_compute=t_compute,
        time_comm=t_comm, time_update=t_update, time_elapsed=state.time_elapsed,
        time_sim=state.time_sim, damper_examples=damper_examples, time_damper=t_damper,
        straggle=got.straggle, examples_dropped=step.batch_size - used,
        staleness=got.staleness,
    )
    state.history.append(record.as_dict())
    emit(record)
    return flag


def _boundary(state: TrainState, ops: Ops, *, flag: int, n_ranks: int, emit: Emit,
              should_stop: Callable[[], bool] | None) -> str | None:
    """After an update: evaluate when due (training ends at the target accuracy); the
    boundary the driver must handle, if any."""
    cfg = state.config
    regular = regular_eval_due(state)
    if regular or eval_due(state):
        record = evaluate(state, ops, emit=emit, n_ranks=n_ranks, check=not regular)
        if (record is not None and cfg.target_accuracy is not None
                and record.test_accuracy >= cfg.target_accuracy):
            state.target_reached = True
            return TARGET
    if cfg.max_time_sim is not None and state.time_sim >= cfg.max_time_sim:
        return MAX_TIME_SIM
    if regular and ops.world_size is not None and cfg.eval_flush:
        return FLUSH  # ranks: the driver sees the regular evaluation now (its callbacks, the
        # pruner); the dense ones that resolve the target travel with the next segment
    if cfg.checkpoint_every and state.update % cfg.checkpoint_every == 0:
        return CHECKPOINT
    if flag == FLAG_CHECKPOINT or (  # ranks: rank 0's clock, in the exchange
        ops.world_size is None and cfg.checkpoint_seconds
        and time.monotonic() - state.checkpoint_clock >= cfg.checkpoint_seconds
    ):
        return CHECKPOINT
    if should_stop is not None and should_stop():
        return INTERRUPTED
    if flag == FLAG_FLUSH:  # all ranks agree: the flag travelled in the all-reduce
        return FLUSH
    return None


def regular_eval_due(state: TrainState) -> bool:
    """A regular evaluation is due after this update: every ``eval_every`` epochs and at the
    end of training."""
    return state.finished() or state.epoch >= state.next_eval * state.config.eval_every


def eval_due(state: TrainState) -> bool:
    """An evaluation is due after this update: a regular one, or a dense one (when the
    examples seen have grown by ``eval_resolution`` since the last, and after every update
    while the last was within ``eval_dense_margin`` below the target)."""
    cfg = state.config
    if regular_eval_due(state):
        return True
    growth = cfg.eval_resolution
    if growth > 0 and state.examples_seen >= (1 + growth) * state.last_eval_examples:
        return True
    return (cfg.eval_dense_margin > 0 and cfg.target_accuracy is not None
            and state.last_eval_accuracy >= cfg.target_accuracy - cfg.eval_dense_margin)


def check_floor(state: TrainState) -> float | None:
    """The accuracy below which an unscheduled evaluation is a check (``eval_checks``): the
    target less the dense margin; None where there are no checks."""
    cfg = state.config
    if not cfg.eval_checks or cfg.eval_dense_margin <= 0 or cfg.target_accuracy is None:
        return None
    return cfg.target_accuracy - cfg.eval_dense_margin


def evaluate(state: TrainState, ops: Ops, *, emit: Emit, n_ranks: int,
             check: bool = False) -> EvalRecord | None:
    """Evaluate on the held-out set, record and emit the result. Measurement, not training:
    neither clock is charged. With ``check`` (the regular schedule did not ask for it), an
    accuracy below :func:`check_floor` records nothing and returns None: it only says that
    no update is evaluated densely yet (every mode decides it alike, on the whole set)."""
    cfg = state.config
    while state.next_eval * cfg.eval_every <= state.epoch:
        state.next_eval += 1
    state.last_eval_examples = state.examples_seen
    floor = check_floor(state) if check else None
    sums = ops.evaluate(n_ranks, at_least=floor)
    if sums is None or (floor is not None and sums[2] and sums[1] / sums[2] < floor):
        state.last_eval_accuracy = 0.0  # below the floor: not within the dense margin
        return None
    loss_sum, correct, count = sums
    accuracy = correct / count if count else float("nan")
    state.best_accuracy = max(state.best_accuracy, accuracy)
    record = EvalRecord(
        update=state.update, epoch=state.epoch, examples_seen=state.examples_seen,
        test_loss=loss_sum / count if count else float("nan"), test_accuracy=accuracy,
        time_elapsed=state.time_elapsed, time_sim=state.time_sim,
        best_accuracy=state.best_accuracy,
    )
    state.last_eval_accuracy = record.test_accuracy
    state.history.append(record.as_dict())
    emit(record)
    return record


def _ranks(ops: Ops) -> int:
    return ops.world_size or 1
