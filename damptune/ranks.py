"""The ranks of a distributed run: processes on Dask workers that run the update loop.

Both data-parallel modes use them. The ``world`` ranks of a run form one ``torch.distributed``
group (gloo on CPU, NCCL on GPU) once, and each runs the same update loop
(:func:`damptune.loop.advance`) on its own copy of the state, in *segments*: a Dask task runs
updates until a boundary the driver must see (evaluation, checkpoint, end, or rank 0's flush
timer) and returns rank 0's records.

An update of P ranks trains on the processes 0..procs-1, ``procs = min(P, world)`` (a process
takes shares ``rank, rank + procs, ...`` when P is larger than the group), through the
subgroup of those processes (``torch.distributed.new_group``, created once per size, by every
rank). The others wait in a broadcast from rank 0 on the whole group, which blocks without
spinning a core. A change of P happens inside the segment: rank 0 tells every rank the new P
in that broadcast, with its state for the ranks that start training, and all switch subgroups;
no round trip to the driver.

Per update, the ranks exchange gradients over ``torch.distributed`` in one of two ways:

- :class:`RankOps` (``decentralized``): one all-reduce of the flat gradient; every rank steps.
- :class:`~damptune.paramserver.ServerOps` (``centralized``): a reduce of the gradients to
  rank 0, the master, which alone applies the optimizer, then a broadcast of its weights.
"""

from __future__ import annotations

import collections
import datetime
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from distributed import get_worker

from damptune.config import TrainConfig, n_workers_for
from damptune.loop import (
    CHECKPOINT,
    DONE,
    FLAG_CHECKPOINT,
    FLAG_FLUSH,
    FLAG_NONE,
    MAX_TIME_SIM,
    MAX_UPDATES,
    RESIZE,
    TARGET,
    StepHere,
    advance,
    evaluate_all,
    shard_evaluate,
)
from damptune.loop import shard_forward as _shard_forward
from damptune.state import TrainData, TrainState
from damptune.worker import forget, registry

__all__ = ["RankOps", "one_host", "open_store", "rank_setup", "rank_advance", "rank_checkpoint",
           "rank_teardown", "SYNC_REASONS"]

FLUSH_SECONDS = 1.0  # default config.flush_seconds: the longest segment before rank 0 reports
# The longest a rank waits in one collective (at most the run's ``timeout``). A rank waits for
# the slowest one's update, and a waiting rank for one segment (~FLUSH_SECONDS plus an update
# and an evaluation). When a rank's worker is lost, the ranks still waiting for it (gloo sees
# only the connections to the dead peer close) are freed by this timeout, and only then can
# the driver re-form the group on their workers: it bounds the stall a lost worker causes.
COLLECTIVE_SECONDS = 30.0
# rank 0 returns its state at these
SYNC_REASONS = (CHECKPOINT, DONE, MAX_UPDATES, TARGET, MAX_TIME_SIM)
# gloo's reduce and all-reduce pass a small message along a chain of ranks: with 16 ranks on
# 2 cores each hop waits for a process to be scheduled (16 ranks, 60 KB: 66 ms all-reduce, 37
# ms reduce+broadcast, 6 ms gather+broadcast, measured here). When all ranks share one host,
# up to this many bytes from all ranks together, they exchange through rank 0 instead (one hop
# each way). Across hosts, and for larger messages, the ranks take gloo's bandwidth-optimal
# ring (the star sends twice the bytes over rank 0's link: on a 50 Mbit/s link, 2 ranks, it
# took 367 ms against the ring's 185), and NCCL always its own.
STAR_MAX_BYTES = 8 * 2**20
# seconds rank 0 of this process spent in recent changes of P (read by bench/resize_cost.py)
RESIZE_SECONDS: collections.deque[float] = collections.deque(maxlen=1000)


class RankOps(StepHere):
    """Gradients on this rank's shares, summed over the training ranks by one all-reduce."""

    def __init__(
        self, model: torch.nn.Module, data: TrainData, rank: int, world: int,
        checkpoint_seconds: float | None = None, micro_batch: int | None = None,
    ) -> None:
        self.model, self.data, self.rank, self.world = model, data, rank, world
        self.micro_batch = micro_batch  # examples per forward+backward pass (None: one)
        self.world_size = 1  # P: the ranks of the update (shares of the batch)
        self.procs = 1  # processes training now: min(P, world)
        self.group: Any = None  # their subgroup (None: the whole group, or one process)
        self.segment_start = time.perf_counter()
        self.checkpoint_seconds = checkpoint_seconds
        self.flush_seconds = FLUSH_SECONDS
        self.checkpoint_clock = time.monotonic()
        self.one_host = False  # all ranks on one host: small messages go through rank 0

    def _mine(self, shares: list[np.ndarray]) -> np.ndarray:
        if len(shares) == self.procs:
            return shares[self.rank]
        return np.concatenate(shares[self.rank :: self.procs])

    def _flag(self, now: float) -> int:
        """Rank 0's decision (the others add 0): checkpoint due, segment long enough, none."""
        if self.rank != 0:
            return FLAG_NONE
        if self.checkpoint_seconds and time.monotonic() - self.checkpoint_clock >= (
            self.checkpoint_seconds
        ):
            return FLAG_CHECKPOINT
        return FLAG_FLUSH if now - self.segment_start > self.flush_seconds else FLAG_NONE

    def _star(self, values: torch.Tensor) -> bool:
        """Exchange ``values`` through rank 0 (gather, then broadcast) rather than gloo's
        chained reduce/all-reduce: on gloo, with all ranks on one host, while all ranks
        together send at most ``STAR_MAX_BYTES``."""
        return (self.one_host and dist.get_backend(self.group) == "gloo"
                and values.numel() * values.element_size() * self.procs <= STAR_MAX_BYTES)

    def _sum_to_root(self, values: torch.Tensor) -> torch.Tensor | None:
        """Rank 0 gets the sum of ``values`` over the training ranks (summed in rank order:
        deterministic); the others None."""
        if not self._star(values):
            dist.reduce(values, dst=0, op=dist.ReduceOp.SUM, group=self.group)
            return values if self.rank == 0 else None
        if self.rank != 0:
            dist.gather(values, None, dst=0, group=self.group)
            return None
        parts = [torch.empty_like(values) for _ in range(self.procs)]
        dist.gather(values, parts, dst=0, group=self.group)
        return torch.stack(parts).sum(0)

    def _all_reduce(self, values: torch.Tensor) -> torch.Tensor:
        """The sum of ``values`` over the training ranks, on every one of them."""
        if self.procs == 1:
            return values
        if not self._star(values):
            dist.all_reduce(values, op=dist.ReduceOp.SUM, group=self.group)
            return values
        total = self._sum_to_root(values)
        if total is not None:
            values.copy_(total)
        dist.broadcast(values, src=0, group=self.group)
        return values

    def _forward(self, shares: list[np.ndarray]) -> tuple[float, float, int]:
        """(loss sum of this rank's shares with its gradient in ``.grad``, seconds, flag)."""
        t0 = time.perf_counter()
        loss = _shard_forward(self.model, self.data.X, self.data.y, self._mine(shares),
                              grad=True, micro_batch=self.micro_batch)
        t1 = time.perf_counter()
        return loss, t1 - t0, self._flag(t1)

    def _flat(self, loss: float, flag: int) -> torch.Tensor:
        """The gradients, the loss sum and the flag in one buffer."""
        params = list(self.model.parameters())
        tail = torch.tensor([loss, float(flag)], dtype=params[0].dtype, device=params[0].device)
        return torch.cat([p.grad.reshape(-1) for p in params] + [tail])  # type: ignore[union-attr]

    def _unflat(self, flat: torch.Tensor) -> tuple[float, int]:
        """Gradients from the buffer into ``.grad``; (loss sum, flag sum)."""
        offset = 0
        for p in self.model.parameters():
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n
        loss_total, flag_sum = flat[offset:].tolist()
        return loss_total, int(round(flag_sum))

    def gradient(self, shares: list[np.ndarray]) -> tuple[float, float, float, int]:
        loss, t_compute, flag = self._forward(shares)
        if self.procs == 1:  # nothing to exchange
            return loss, t_compute, 0.0, flag
        t1 = time.perf_counter()
        flat = self._all_reduce(self._flat(loss, flag))
        loss_total, flag_sum = self._unflat(flat)
        return loss_total, t_compute, time.perf_counter() - t1, flag_sum

    def loss(self, shares: list[np.ndarray]) -> float:
        loss = _shard_forward(self.model, self.data.X, self.data.y, self._mine(shares),
                              grad=False)
        device = next(self.model.parameters()).device
        return float(self._all_reduce(torch.tensor([loss], dtype=torch.float64, device=device)))

    def evaluate(self, n_ranks: int, *, at_least: float | None = None
                 ) -> tuple[float, int, int] | None:
        X, y = self.data.X_test, self.data.y_test
        if X is None or y is None:
            return float("nan"), 0, 0
        if self.procs == 1:  # the whole set here: it may stop early, as LocalOps does
            return evaluate_all(self.model, X, y, at_least=at_least)
        shard = shard_evaluate(self.model, X, y, _shard_rows(len(y), self.procs, self.rank))
        assert shard is not None  # no at_least: never stops early
        loss, correct = shard
        device = next(self.model.parameters()).device
        out = self._all_reduce(torch.tensor([loss, correct], dtype=torch.float64, device=device))
        return float(out[0]), int(round(float(out[1]))), len(y)


def _shard_rows(n: int, procs: int, rank: int) -> range:
    """Rank ``rank``'s consecutive share of ``n`` rows among ``procs`` (``np.array_split``'s:
    the first ``n % procs`` shares have one row more)."""
    size, extra = divmod(n, procs)
    start = rank * size + min(rank, extra)
    return range(start, start + size + (rank < extra))


def _host(address: str) -> str:
    return address.split("://")[-1].rsplit(":", 1)[0].strip("[]")


def one_host(addresses: list[str]) -> bool:
    """Whether the Dask workers at ``addresses`` share one host (one IP address)."""
    return len({_host(a) for a in addresses}) == 1


def open_store(group_key: str, timeout: float) -> tuple[str, int]:
    """On rank 0's worker: start the rendezvous store on a free port; return (host, port)."""
    host = _host(get_worker().address)
    store = dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    registry(group_key)["store"] = store
    return host, store.port


def _ops_class(config: TrainConfig) -> type[RankOps]:
    if config.mode == "centralized":
        from damptune.paramserver import ServerOps

        return ServerOps
    return RankOps


def rank_setup(
    group_key: str,
    rank: int,
    world: int,
    host: str,
    port: int,
    config: TrainConfig,
    data: TrainData,
    ckpt: dict[str, Any],
    n_ranks: int,
    device: str = "cpu",
    backend: str = "gloo",
    same_host: bool = False,
) -> int:
    """Join the group of ``world`` ranks, build this rank's state from the driver's
    checkpoint dict, and train the next updates on ``n_ranks`` ranks; ``device`` and
    ``backend`` are the driver's placement (:func:`damptune.devices.place_ranks`);
    ``same_host``: every rank's worker is on one host."""
    reg = registry(group_key)
    timeout = datetime.timedelta(seconds=config.timeout)
    if dist.is_initialized():  # a group left behind by a driver that died: not ours any more
        dist.destroy_process_group()
    store = reg.get("store") or dist.TCPStore(host, port, is_master=False, timeout=timeout)
    placed = torch.device(device)
    if placed.type == "cuda":
        torch.cuda.set_device(placed)
    dist.init_process_group(
        backend, store=dist.PrefixStore(group_key, store), rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=min(config.timeout, COLLECTIVE_SECONDS)),
    )
    state = TrainState(config, device=placed)
    state.restore(ckpt)
    reg["state"], reg["groups"] = state, {}
    reg["ops"] = _ops_class(config)(state.model, data.to(placed), rank, world,
                                    config.checkpoint_seconds, config.micro_batch_size)
    reg["ops"].flush_seconds = config.flush_seconds
    reg["ops"].one_host = same_host
    _activate(reg, n_ranks)
    return rank


def _activate(reg: dict[str, Any], n_ranks: int) -> None:
    """Train on ``n_ranks`` ranks from now on, on processes 0..min(n_ranks, world)-1. Every
    rank of the group calls this, in the same order, as ``new_group`` requires (a subgroup
    made by its members alone hung at 16 ranks, gloo, torch 2.13)."""
    ops: RankOps = reg["ops"]
    groups: dict[int, Any] = reg["groups"]
    procs = min(n_ranks, ops.world)
    if procs not in groups:
        groups[procs] = (dist.new_group(ranks=list(range(procs)))
                         if 1 < procs < ops.world else None)
    ops.world_size, ops.procs, ops.group = n_ranks, procs, groups[procs]


def _control(reg: dict[str, Any], reason: str | None) -> str:
    """Every rank of the group: rank 0 says why the training ranks stopped. On a change of P
    it sends the new P, and its state for the ranks that start training (they restore it, as
    every rank of a newly formed group would); all switch to the new subgroup."""
    ops: RankOps = reg["ops"]
    state: TrainState = reg["state"]
    t0 = time.perf_counter()
    message: list[Any] = [None]
    if ops.rank == 0:
        n_ranks = (n_workers_for(state.pending_step.batch_size, state.config)
                   if reason == RESIZE and state.pending_step is not None else None)
        grows = n_ranks is not None and min(n_ranks, ops.world) > ops.procs
        message = [(reason, n_ranks, rank_checkpoint_of(state) if grows else None)]
    dist.broadcast_object_list(message, src=0)
    reason, n_ranks, ckpt = message[0]
    if reason == RESIZE:
        if ckpt is not None and ops.procs <= ops.rank < min(n_ranks, ops.world):
            state.restore(ckpt)
        _activate(reg, n_ranks)
        if ops.rank == 0:
            RESIZE_SECONDS.append(time.perf_counter() - t0)
    return str(reason)


def _segment(reg: dict[str, Any]) -> str:
    """Updates until a boundary the driver must see; changes of P are handled here."""
    state: TrainState = reg["state"]
    ops: RankOps = reg["ops"]
    while True:
        reason = (advance(state, ops, emit=lambda record: None)
                  if ops.rank < ops.procs else None)
        if ops.procs < ops.world or reason == RESIZE:  # same decision on every rank
            reason = _control(reg, reason)
        if reason != RESIZE:
            return str(reason)


def rank_advance(group_key: str) -> tuple[str, list[dict[str, Any]], dict[str, Any] | None]:
    """Run a segment; rank 0 returns its records, and its state at a sync boundary."""
    reg = registry(group_key)
    state: TrainState = reg["state"]
    ops: RankOps = reg["ops"]
    ops.segment_start = time.perf_counter()
    state.history = []
    try:
        reason = _segment(reg)
    except BaseException:
        _abort(group_key)
        raise
    if reason == CHECKPOINT:
        ops.checkpoint_clock = time.monotonic()
    if ops.rank != 0:
        return reason, [], None
    ckpt = rank_checkpoint_of(state) if reason in SYNC_REASONS else None
    return reason, state.history, ckpt


def _abort(group_key: str) -> None:
    """A collective failed (a peer died or timed out): leave the group at once. Closing this
    rank's connections fails the collectives its live peers wait in, so the whole group is
    freed in moments, not after ``COLLECTIVE_SECONDS``, and the driver can re-form it."""
    if dist.is_initialized():
        dist.destroy_process_group()
    forget(group_key)


def rank_checkpoint(group_key: str) -> dict[str, Any]:
    return rank_checkpoint_of(registry(group_key)["state"])


def rank_checkpoint_of(state: TrainState) -> dict[str, Any]:
    ckpt = state.checkpoint()
    del ckpt["history"]  # the driver keeps the history
    return ckpt


def rank_teardown(group_key: str) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    forget(group_key)
