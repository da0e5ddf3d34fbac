"""Decentralized (all-reduce) data parallelism: P ranks on P Dask workers.

The ranks form a ``torch.distributed`` group (gloo on CPU, NCCL on GPU) and each runs the same
update loop (:func:`damptune.loop.advance`) on its own copy of the model: it computes the
gradient sum over its share of the global batch and the group all-reduces one flat buffer
(gradients, loss sum and a flush flag). The driver runs the loop in *segments*: each Dask task
runs updates until a boundary (evaluation, checkpoint, change of P, end, or rank 0's flush
timer), and returns rank 0's records, so the driver sees progress without a round trip per
update.

The group is formed once per run with ``max_workers`` ranks. A smaller P trains on the
subgroup of ranks 0..P-1 (``torch.distributed.new_group``, created once per P in use, by every
rank); ranks outside it get no task and sleep in their Dask worker. A change of P costs one
round trip: every active rank restores rank 0's state at the boundary (as a re-formed group
did, so results are unchanged) and switches to the subgroup. The group is re-formed only to
recover from a lost worker.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from distributed import Client, get_worker

from damptune.cluster import WorkerGroup, gather_within, scatter_data
from damptune.config import TrainConfig, n_workers_for
from damptune.errors import ClusterError, DamptuneError
from damptune.loop import (
    CHECKPOINT,
    DONE,
    FLAG_CHECKPOINT,
    FLAG_FLUSH,
    FLAG_NONE,
    MAX_UPDATES,
    RESIZE,
    Emit,
    advance,
    shard_evaluate,
)
from damptune.loop import shard_forward as _shard_forward
from damptune.records import record_from_dict
from damptune.state import TrainData, TrainState, resolve_device
from damptune.worker import forget, registry

__all__ = ["DecentralizedRunner"]

FLUSH_SECONDS = 1.0  # rank 0 ends a segment after this long, so progress reaches the driver
MAX_RECOVERIES = 5  # lost ranks tolerated in one run before giving up
log = logging.getLogger("damptune.decentralized")
_SYNC_REASONS = (CHECKPOINT, RESIZE, DONE, MAX_UPDATES)


# -- on the workers ------------------------------------------------------------------------
class RankOps:
    """Gradients on this rank's share, summed over the group by one all-reduce."""

    def __init__(
        self, model: torch.nn.Module, data: TrainData, rank: int, world: int,
        checkpoint_seconds: float | None = None,
    ) -> None:
        self.model, self.data, self.rank, self.world_size = model, data, rank, world
        self.group: Any = None  # the active subgroup (None: the whole group)
        self.segment_start = time.perf_counter()
        self.checkpoint_seconds = checkpoint_seconds
        self.checkpoint_clock = time.monotonic()

    def _flag(self, now: float) -> int:
        """Rank 0's decision (the others add 0): checkpoint due, segment long enough, none."""
        if self.rank != 0:
            return FLAG_NONE
        if self.checkpoint_seconds and time.monotonic() - self.checkpoint_clock >= (
            self.checkpoint_seconds
        ):
            return FLAG_CHECKPOINT
        return FLAG_FLUSH if now - self.segment_start > FLUSH_SECONDS else FLAG_NONE

    def _all_reduce(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(values, op=dist.ReduceOp.SUM, group=self.group)
        return values

    def gradient(self, shares: list[np.ndarray]) -> tuple[float, float, float, int]:
        t0 = time.perf_counter()
        loss = _shard_forward(self.model, self.data.X, self.data.y, shares[self.rank], grad=True)
        t1 = time.perf_counter()
        params = list(self.model.parameters())
        flag = self._flag(t1)
        if self.world_size == 1:  # nothing to exchange
            return loss, t1 - t0, 0.0, flag
        device = params[0].device
        tail = torch.tensor([loss, float(flag)], dtype=params[0].dtype, device=device)
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [tail])  # type: ignore[union-attr]
        self._all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n
        loss_total, flag_sum = flat[offset:].tolist()
        return loss_total, t1 - t0, time.perf_counter() - t1, int(round(flag_sum))

    def loss(self, shares: list[np.ndarray]) -> float:
        loss = _shard_forward(self.model, self.data.X, self.data.y, shares[self.rank], grad=False)
        device = next(self.model.parameters()).device
        return float(self._all_reduce(torch.tensor([loss], dtype=torch.float64, device=device)))

    def evaluate(self, n_ranks: int) -> tuple[float, int, int]:
        X, y = self.data.X_test, self.data.y_test
        if X is None or y is None:
            return float("nan"), 0, 0
        idx = np.array_split(np.arange(len(y)), self.world_size)[self.rank]
        loss, correct = shard_evaluate(self.model, X, y, idx)
        device = next(self.model.parameters()).device
        out = self._all_reduce(torch.tensor([loss, correct], dtype=torch.float64, device=device))
        return float(out[0]), int(round(float(out[1]))), len(y)


def _host(address: str) -> str:
    return address.split("://")[-1].rsplit(":", 1)[0].strip("[]")


def open_store(group_key: str, timeout: float) -> tuple[str, int]:
    """On rank 0's worker: start the rendezvous store on a free port; return (host, port)."""
    host = _host(get_worker().address)
    store = dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    registry(group_key)["store"] = store
    return host, store.port


def rank_setup(
    group_key: str,
    rank: int,
    world: int,
    host: str,
    port: int,
    config: TrainConfig,
    data: TrainData,
    ckpt: dict[str, Any],
    active: int,
) -> int:
    """Join the group of ``world`` ranks, build this rank's state from the driver's
    checkpoint dict, and train on the first ``active`` ranks."""
    reg = registry(group_key)
    timeout = datetime.timedelta(seconds=config.timeout)
    if dist.is_initialized():  # a group left behind by a driver that died: not ours any more
        dist.destroy_process_group()
    store = reg.get("store") or dist.TCPStore(host, port, is_master=False, timeout=timeout)
    device = resolve_device(config, local_rank=rank)  # one GPU per rank (cuda:rank % count)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        config.backend, store=dist.PrefixStore(group_key, store), rank=rank, world_size=world,
        timeout=timeout,
    )
    state = TrainState(config, device=device)
    state.restore(ckpt)
    reg["state"], reg["world"], reg["groups"] = state, world, {}
    reg["ops"] = RankOps(state.model, data.to(device), rank, world, config.checkpoint_seconds)
    _activate(reg, active, create=True)
    return rank


def _activate(reg: dict[str, Any], active: int, *, create: bool) -> None:
    """Train on ranks 0..active-1 from now on. ``create``: make that subgroup first (every
    rank of the group calls this, in the same order, as ``new_group`` requires; a subgroup
    made by its members alone hung at 16 ranks, gloo, torch 2.13)."""
    groups: dict[int, Any] = reg["groups"]
    if create and active not in groups:
        groups[active] = (dist.new_group(ranks=list(range(active)))
                          if 1 < active < reg["world"] else None)
    ops: RankOps = reg["ops"]
    ops.world_size, ops.group = active, groups.get(active)


def rank_resize(group_key: str, active: int, ckpt: dict[str, Any] | None, create: bool) -> int:
    """A change of P: create the subgroup if asked (all ranks), then, on the ranks that train
    next, restore rank 0's state at the boundary and train on the subgroup."""
    reg = registry(group_key)
    if ckpt is not None:
        reg["state"].restore(ckpt)
    _activate(reg, active, create=create)
    return active


def rank_advance(group_key: str) -> tuple[str, list[dict[str, Any]], dict[str, Any] | None]:
    """Run a segment; rank 0 returns its records, and its state at a sync boundary."""
    reg = registry(group_key)
    state: TrainState = reg["state"]
    ops: RankOps = reg["ops"]
    ops.segment_start = time.perf_counter()
    state.history = []
    reason = advance(state, ops, emit=lambda record: None)
    if reason == CHECKPOINT:
        ops.checkpoint_clock = time.monotonic()
    if ops.rank != 0:
        return reason, [], None
    ckpt = _rank_checkpoint(state) if reason in _SYNC_REASONS else None
    return reason, state.history, ckpt


def rank_checkpoint(group_key: str) -> dict[str, Any]:
    return _rank_checkpoint(registry(group_key)["state"])


def _rank_checkpoint(state: TrainState) -> dict[str, Any]:
    ckpt = state.checkpoint()
    del ckpt["history"]  # the driver keeps the history
    return ckpt


def rank_teardown(group_key: str) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    forget(group_key)


# -- on the driver -------------------------------------------------------------------------
class DecentralizedRunner:
    """Drives segments on a group of ranks and re-forms the group when P changes."""

    def __init__(
        self, *, client: Client, config: TrainConfig, data: TrainData, data_future: Any,
        group: WorkerGroup,
    ) -> None:
        if config.max_workers > len(group.addresses):
            raise ClusterError(
                f"mode='decentralized' needs one Dask worker per rank: max_workers="
                f"{config.max_workers} but the run has {len(group.addresses)} worker(s). "
                "Lower max_workers or add workers."
            )
        self.client, self.config, self.data, self.data_future = client, config, data, data_future
        self.group = group
        self.group_key: str | None = None
        self.ranks: list[str] = []  # the group's workers (max_workers of them)
        self.active = 0  # ranks 0..active-1 train now
        self.subgroups: set[int] = set()  # sizes whose subgroup exists on every rank
        self.synced = True
        self.synced_len = 0  # history records the last synced state covers
        self.recoveries = 0

    def _wait(self, futures: list[Any], what: str) -> list[Any]:
        return gather_within(futures, timeout=self.config.timeout, what=what)

    def _submit(self, rank: int, fn: Any, *args: Any) -> Any:
        return self.client.submit(
            fn, *args, workers=[self.ranks[rank]], allow_other_workers=False, pure=False
        )

    def form(self, state: TrainState, active: int) -> None:
        """Start a group of ``max_workers`` ranks from the state's checkpoint, training on
        the first ``active``."""
        self.teardown()
        self.group_key = f"group-{uuid.uuid4().hex[:12]}"
        world = self.config.max_workers
        self.ranks = self.group.addresses[:world]
        ckpt = _rank_checkpoint(state)
        (host, port), = self._wait(
            [self._submit(0, open_store, self.group_key, self.config.timeout)], "rendezvous"
        )
        futures = [
            self._submit(r, rank_setup, self.group_key, r, world, host, port, self.config,
                         self.data_future, ckpt, active)
            for r in range(world)
        ]
        self._wait(futures, f"forming a group of {world} ranks")
        self.active, self.subgroups = active, {active}
        self.synced, self.synced_len = True, len(state.history)

    def resize(self, state: TrainState, active: int) -> None:
        """Train on ranks 0..active-1 from the driver's (synced) state: one round trip; the
        first use of a size also creates its subgroup, on every rank."""
        self.sync(state)
        ckpt = _rank_checkpoint(state)
        create = active not in self.subgroups
        targets = range(len(self.ranks)) if create else range(active)
        self._wait([self._submit(r, rank_resize, self.group_key, active,
                                 ckpt if r < active else None, create) for r in targets],
                   f"switching to {active} ranks")
        self.active = active
        self.subgroups.add(active)

    def world_for(self, state: TrainState) -> int:
        """The group size the next update needs (a guess if it is not planned yet)."""
        if state.pending_step is not None:
            return n_workers_for(state.pending_step.batch_size, self.config)
        for record in reversed(state.history):
            if record.get("kind") == "update":
                return int(record["n_workers"])
        return n_workers_for(state.damper.initial, self.config)

    def advance(self, state: TrainState, emit: Emit,
                should_stop: Callable[[], bool] | None = None) -> str:
        """Segments until a boundary; a stop request is seen at the next FLUSH (~1 s)."""
        while True:
            try:
                if self.group_key is None:
                    self.form(state, self.world_for(state))
                elif self.active != self.world_for(state):
                    self.resize(state, self.world_for(state))
                futures = [self._submit(r, rank_advance, self.group_key)
                           for r in range(self.active)]
                self.synced = False
                results = self._wait(futures, "training segment")
            except (DamptuneError, TypeError, ValueError) as exc:
                if not isinstance(exc, ClusterError):
                    raise  # a bug or bad configuration: retrying cannot help
                self._recover(state, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a worker was lost: continue without it
                self._recover(state, exc)
                continue
            reasons = {r[0] for r in results}
            if len(reasons) != 1:
                raise ClusterError(f"ranks disagree on where the segment ended: {reasons}")
            reason, records, ckpt = results[0]
            if ckpt is not None:
                ckpt["history"] = state.history + records
                state.restore(ckpt)
                self.synced, self.synced_len = True, len(state.history)
            else:
                state.history.extend(records)
            for record in records:
                emit(record_from_dict(record))
            if reason == RESIZE:  # the next turn switches to the subgroup it needs
                continue
            return reason

    def sync(self, state: TrainState) -> None:
        """Bring the driver's state up to rank 0's (e.g. after a callback stopped training)."""
        if self.synced or self.group_key is None:
            return
        (ckpt,) = self._wait([self._submit(0, rank_checkpoint, self.group_key)], "sync")
        ckpt["history"] = state.history
        state.restore(ckpt)
        self.synced, self.synced_len = True, len(state.history)

    def _recover(self, state: TrainState, exc: BaseException) -> None:
        """A rank was lost: drop the group, go back to the last synced state (at most one
        checkpoint interval of work is redone) and re-form the group on live workers."""
        self.recoveries += 1
        if self.recoveries > MAX_RECOVERIES:
            raise ClusterError(f"ranks failed {self.recoveries} times; last: {exc!r}") from exc
        log.warning("lost a rank (%r); re-forming the group from update %d", exc, state.update)
        with contextlib.suppress(Exception):  # the dead rank cannot answer; teardown resets
            self.teardown(timeout=10.0)
        del state.history[self.synced_len:]
        self.group.replace(set(), need=self.config.max_workers, timeout=self.config.timeout)
        self.data_future = scatter_data(self.client, self.data)  # again if its holders died

    def teardown(self, timeout: float | None = None) -> None:
        if self.group_key is None:
            return
        futures = [self._submit(r, rank_teardown, self.group_key) for r in range(len(self.ranks))]
        try:
            gather_within(futures, timeout=timeout or self.config.timeout, what="teardown")
        finally:
            self.group_key, self.ranks, self.active, self.subgroups = None, [], 0, set()

    def close(self, state: TrainState) -> None:
        try:
            self.sync(state)
        finally:
            self.teardown()
