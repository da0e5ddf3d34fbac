"""The driver of a distributed run: it forms the ranks' group and runs their segments.

Both data-parallel modes train on ranks (:mod:`damptune.ranks`); the driver holds the run's
state as of the last boundary the ranks reported. The group is formed once per run; it is
re-formed only to recover from a lost worker. Each segment is one Dask task per rank; the
ranks change P inside it, so the driver sees evaluations, checkpoints, the end, and rank 0's
flush every ``FLUSH_SECONDS``, and nothing per update.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
import warnings
from collections.abc import Callable
from typing import Any

from distributed import Client

from damptune.cluster import WorkerGroup, gather_within, scatter_data
from damptune.config import TrainConfig, n_workers_for
from damptune.devices import Placement, cpu_placement, place_ranks, worker_report
from damptune.errors import ClusterError, DamptuneError
from damptune.loop import INTERRUPTED, Emit
from damptune.ranks import (
    one_host,
    open_store,
    rank_advance,
    rank_checkpoint,
    rank_checkpoint_of,
    rank_setup,
    rank_teardown,
)
from damptune.records import record_from_dict
from damptune.state import TrainData, TrainState

__all__ = ["SegmentRunner", "group_size"]

MAX_RECOVERIES = 5  # lost ranks tolerated in one run before giving up
log = logging.getLogger("damptune.segments")


def group_size(config: TrainConfig, n_workers: int) -> int:
    """The ranks of the group: ``max_workers``, one per Dask worker. The parameter server
    also runs on fewer workers (a rank then takes several shares of the batch)."""
    if config.max_workers <= n_workers:
        return config.max_workers
    if config.mode == "centralized" and n_workers > 0:
        return n_workers
    raise ClusterError(
        f"mode={config.mode!r} needs one Dask worker per rank: max_workers="
        f"{config.max_workers} but the run has {n_workers} worker(s). "
        "Lower max_workers or add workers."
    )


class SegmentRunner:
    """Drives segments on a group of ranks; re-forms the group after a lost worker."""

    def __init__(
        self, *, client: Client, config: TrainConfig, data: TrainData, group: WorkerGroup,
    ) -> None:
        self.world = group_size(config, len(group.addresses))
        self.client, self.config, self.data = client, config, data
        self.group = group
        self.data_future = self._scatter()
        self.group_key: str | None = None
        self.ranks: list[str] = []  # the group's workers
        self.synced = True
        self.synced_len = 0  # history records the last synced state covers
        self.recoveries = 0

    def _scatter(self) -> Any:
        """The data, on the workers the ranks train on (a task elsewhere fetches it)."""
        return scatter_data(self.client, self.data, workers=self.group.addresses[: self.world])

    def _wait(self, futures: list[Any], what: str, *, timeout: float | None = None) -> list[Any]:
        """The ranks' results; a rank's error, or the loss of a rank's worker, at once."""
        return gather_within(futures, timeout=timeout or self.config.timeout, what=what,
                             client=self.client, workers=list(self.ranks))

    def _submit(self, rank: int, fn: Any, *args: Any) -> Any:
        return self.client.submit(
            fn, *args, workers=[self.ranks[rank]], allow_other_workers=False, pure=False
        )

    def form(self, state: TrainState) -> None:
        """Start a group of ``world`` ranks from the state's checkpoint, each on the device
        the placement gives it."""
        self.teardown()
        self.ranks = self.group.addresses[: self.world]
        if len(self.ranks) < self.world:
            raise ClusterError(f"{self.world} ranks need as many workers; the run has "
                               f"{len(self.ranks)}")
        plan = self.placement()
        self.group_key = f"group-{uuid.uuid4().hex[:12]}"
        ckpt = rank_checkpoint_of(state)
        (host, port), = self._wait(
            [self._submit(0, open_store, self.group_key, self.config.timeout)], "rendezvous"
        )
        futures = [
            self._submit(r, rank_setup, self.group_key, r, self.world, host, port, self.config,
                         self.data_future, ckpt, self.n_ranks(state), plan.devices[r],
                         plan.backend, one_host(self.ranks))
            for r in range(self.world)
        ]
        self._wait(futures, f"forming a group of {self.world} ranks")
        self.synced, self.synced_len = True, len(state.history)

    def placement(self) -> Placement:
        """Each rank's device and the group's backend (:func:`damptune.devices.place_ranks`),
        from what the ranks' workers report (one small task each; none on CPU)."""
        if self.config.device == "cpu":
            return cpu_placement(self.world, backend=self.config.backend)
        reports = self._wait([self._submit(r, worker_report) for r in range(self.world)],
                             "asking the workers for their GPUs")
        plan = place_ranks(self.config.device, reports, share_gpus=self.config.share_gpus,
                           backend=self.config.backend)
        if plan.note:
            log.warning("%s", plan.note)
            warnings.warn(plan.note, stacklevel=2)
        log.info("ranks on %s (backend %s)", ", ".join(
            f"{d}@{r.host}" for d, r in zip(plan.devices, reports, strict=True)), plan.backend)
        return plan

    def n_ranks(self, state: TrainState) -> int:
        """The P of the next update (a guess if it is not planned yet: the ranks switch)."""
        if state.pending_step is not None:
            return n_workers_for(state.pending_step.batch_size, self.config)
        for record in reversed(state.history):
            if record.get("kind") == "update":
                return int(record["n_workers"])
        return n_workers_for(state.damper.initial, self.config)

    def advance(self, state: TrainState, emit: Emit,
                should_stop: Callable[[], bool] | None = None) -> str:
        """One segment (a stop request is seen at its end, ~1 s); the reason it ended."""
        while True:
            try:
                if self.group_key is None:
                    self.form(state)
                futures = [self._submit(r, rank_advance, self.group_key)
                           for r in range(self.world)]
                self.synced = False
                results = self._wait(futures, "training segment")
            except (DamptuneError, TypeError, ValueError) as exc:
                if not isinstance(exc, ClusterError):
                    raise  # a bug or bad configuration: retrying cannot help
                if self._lost_while_stopping(state, exc, should_stop):
                    return INTERRUPTED
                self._recover(state, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a worker was lost: continue without it
                if self._lost_while_stopping(state, exc, should_stop):
                    return INTERRUPTED
                self._recover(state, exc)
                continue
            return self._take(state, results, emit)

    def _take(self, state: TrainState, results: list[Any], emit: Emit) -> str:
        """Rank 0's records into the driver's state (and its state at a sync boundary)."""
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
        return str(reason)

    def sync(self, state: TrainState) -> None:
        """Bring the driver's state up to rank 0's (e.g. after a callback stopped training)."""
        if self.synced or self.group_key is None:
            return
        (ckpt,) = self._wait([self._submit(0, rank_checkpoint, self.group_key)], "sync")
        ckpt["history"] = state.history
        state.restore(ckpt)
        self.synced, self.synced_len = True, len(state.history)

    def _lost_while_stopping(self, state: TrainState, exc: BaseException,
                             should_stop: Callable[[], bool] | None) -> bool:
        """A rank was lost while a stop is asked: a machine's shutdown signals every process,
        the Dask workers with the driver, and no replacement will come. Then the run does not
        wait for one: it drops the group and goes back to the last synced state, which the
        caller checkpoints (the work since, at most one checkpoint interval, is redone by the
        rerun). True then."""
        if should_stop is None or not should_stop():
            return False
        log.warning("lost a rank (%r) while stopping: ending at update %d, the last synced "
                    "state", exc, state.update)
        self._back_to_synced(state)
        self.synced = True
        return True

    def _back_to_synced(self, state: TrainState) -> None:
        """Drop the group and the records since the last synced state (the driver's)."""
        with contextlib.suppress(Exception):  # the dead rank cannot answer; teardown resets
            self.teardown(timeout=10.0)
        del state.history[self.synced_len:]

    def _recover(self, state: TrainState, exc: BaseException) -> None:
        """A rank was lost: drop the group, go back to the last synced state (at most one
        checkpoint interval of work is redone) and re-form the group on live workers."""
        self.recoveries += 1
        if self.recoveries > MAX_RECOVERIES:
            raise ClusterError(f"ranks failed {self.recoveries} times; last: {exc!r}") from exc
        log.warning("lost a rank (%r); re-forming the group from update %d", exc, state.update)
        self._back_to_synced(state)
        self.group.replace(set(), need=self.world, timeout=self.config.timeout)
        self.data_future = self._scatter()  # again if its holders died

    def teardown(self, timeout: float | None = None) -> None:
        """Release the ranks. A rank whose worker left or does not answer holds nothing this
        run still needs: that is logged, not raised."""
        if self.group_key is None:
            return
        futures = [self._submit(r, rank_teardown, self.group_key) for r in range(len(self.ranks))]
        try:
            self._wait(futures, "teardown", timeout=timeout)
        except ClusterError as exc:
            log.info("teardown of group %s: %s", self.group_key, exc)
        finally:
            self.group_key, self.ranks = None, []

    def close(self, state: TrainState) -> None:
        try:
            self.sync(state)
        finally:
            self.teardown()
