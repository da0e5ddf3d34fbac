"""Where trials train: one Dask cluster per flow run, shared by trials that gang-allocate it.

Sources (the flow's ``cluster`` parameter):

* ``"local"`` — a ``LocalCluster`` of single-threaded worker processes on 127.0.0.1, as many
  as the largest network size, started once per flow run (no trial pays its start-up);
* ``"tcp://HOST:PORT"`` — an existing scheduler (its workers must already be there);
* a YAML file (e.g. ``infra/cluster-slurm-spot.yaml``) naming any Dask cluster class by import path
  with its keyword arguments: ``{class: dask_jobqueue.SLURMCluster, kwargs: {...}}``; it is
  scaled to the largest network size.

A trial of network size P acquires P workers at once (all or nothing, so two trials never
deadlock holding half of what each needs) and releases them when it ends.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from distributed import Client

from damptune import ClusterError, ConfigError, claims, interrupt, membership
from damptune.cluster import scheduler_address, worker_addresses
from damptune.preemption import TOPIC, PreemptionPlugin
from tasks.cluster_yaml import read_cluster_yaml
from tasks.gpus import local_cluster_for

__all__ = ["WorkerPool", "Gang", "open_cluster", "check_cluster"]

EXCLUDED_SECONDS = 120.0  # how long a worker seen failing or given notice is handed out no more


class WorkerPool:
    """Gang allocation of the live cluster's workers among concurrent trials.

    Membership is the scheduler's: a trial is given workers from the scheduler's worker list
    at the time it asks, less those other trials hold, in this run or in any other run that
    shares the scheduler (:mod:`damptune.claims`: every worker a trial holds is claimed on the
    scheduler, all or nothing). Workers that leave are never handed out again; workers that
    join (replacements, a ``scale()``d or adaptive cluster) are. The scheduler's
    add/remove-worker events, and other runs' releases, wake trials waiting for workers.
    """

    def __init__(self, client: Client, *, timeout: float = 600.0) -> None:
        self.client, self.address, self.timeout = client, scheduler_address(client), timeout
        self.owner = f"pool-{uuid.uuid4().hex[:12]}"  # this run's name in the scheduler's claims
        self._held: set[str] = set()
        # one claim on the scheduler at a time per pool: a worker is never granted to two of
        # this pool's trials (the scheduler sees one owner for all of them)
        self._claiming = threading.Lock()
        # given notice, or seen failing by a trial: address -> until when (time.monotonic) it
        # is handed out no more; the scheduler may list a dead worker for a while
        self._excluded: dict[str, float] = {}
        self.waiting = 0  # trials waiting for workers now
        self._cond = threading.Condition()
        client.subscribe_topic(membership.TOPIC, self._on_event)  # workers join or leave
        client.subscribe_topic(TOPIC, self._on_preemption)

    # The two handlers below run on the client's event loop. They take ``_cond`` briefly, so
    # no code may call the client (a call that needs that loop) while holding ``_cond``;
    # ``_claiming`` may be held across a call (the handlers never take it).

    def _on_event(self, event: Any) -> None:
        with self._cond:
            self._cond.notify_all()

    def _on_preemption(self, event: Any) -> None:
        with self._cond:  # it is leaving: hand it to no new trial
            self._exclude([str(event[1].get("worker", ""))])

    def _exclude(self, workers: list[str]) -> None:
        until = time.monotonic() + EXCLUDED_SECONDS
        self._excluded.update(dict.fromkeys(workers, until))

    def live(self) -> list[str]:
        """The workers the scheduler knows now (sorted), less those given notice or seen
        failing in the last ``EXCLUDED_SECONDS`` (the scheduler may list a dead worker for a
        while). Asks the scheduler: never call it holding ``_cond``."""
        return self._usable(worker_addresses(self.client))

    def _usable(self, workers: list[str]) -> list[str]:
        now = time.monotonic()
        return [w for w in workers if self._excluded.get(w, 0.0) <= now]

    @property
    def size(self) -> int:
        return len(self.live())

    def take(self, n: int, *, at_least: int | None = None, timeout: float | None = None,
             have: int = 0) -> list[str]:
        """Up to ``n`` free live workers (sorted), at least ``at_least`` (default ``n``),
        claimed on the scheduler so no other run uses them: waits up to ``timeout`` s, else
        ClusterError naming the cluster and the counts; a ClusterError at once when a stop is
        asked meanwhile (a machine's shutdown takes the workers too: none will come)."""
        need = n if at_least is None else at_least
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            known = worker_addresses(self.client)  # outside the lock: see _on_event
            with self._claiming:
                with self._cond:  # exclusions made meanwhile count too
                    free = sorted(set(self._usable(known)) - self._held)
                taken = self._claim(free, n, need) if len(free) >= need else None
                if taken is not None:
                    with self._cond:
                        self._held.update(taken)
                    return taken
            if deadline <= time.monotonic():
                raise self._wait_error(known, need=need, have=have, wait=wait)
            if interrupt.requested():
                raise ClusterError(f"a stop was asked ({interrupt.requested()}) while a trial "
                                   f"holding {have} waited for {need} more worker(s)")
            with self._cond:  # membership events and releases wake it; 1 s at most
                self.waiting += 1
                try:
                    self._cond.wait(timeout=min(deadline - time.monotonic(), 1.0))
                finally:
                    self.waiting -= 1

    def _claim(self, free: list[str], n: int, need: int) -> list[str] | None:
        """Claim up to ``n`` of ``free`` on the scheduler, at least ``need``; None if other
        runs hold too many of them."""
        if need <= 0 and not free:
            return []
        got: list[str] = self.client.run_on_scheduler(
            claims.claim, owner=self.owner, client_id=self.client.id, candidates=free, n=n,
            at_least=need)
        return got if len(got) >= need else None

    def _wait_error(self, known: list[str], *, need: int, have: int,
                    wait: float) -> ClusterError:
        live = self._usable(known)
        others = set(self.client.run_on_scheduler(claims.claimed_by_others, owner=self.owner))
        with self._cond:
            ours = len(set(live) & self._held)
        return ClusterError(
            f"the cluster at {self.address} has {len(live)} live worker(s), {ours} of them "
            f"held by this run's trials and {len(set(live) & others)} by other runs; a trial "
            f"holding {have} needs {need} more (waited {wait:g} s)")

    def give_back(self, workers: list[str], *, lost: bool = False) -> None:
        """Release ``workers``; ``lost``: a trial saw them fail, hand them out no more. The
        scheduler's claims go first: until then no trial of this pool can take them again."""
        if workers:
            with contextlib.suppress(Exception):  # a closed client's claims ended with it
                self.client.run_on_scheduler(claims.release, owner=self.owner,
                                             workers=list(workers))
        with self._cond:
            self._held.difference_update(workers)
            if lost:
                self._exclude(workers)
            self._cond.notify_all()

    @contextlib.contextmanager
    def acquire(self, n: int, *, timeout: float | None = None) -> Iterator[Gang]:
        """Hold ``n`` live workers (a :class:`Gang`) for the duration of the ``with`` block."""
        gang = Gang(self, self.take(n, timeout=timeout))
        try:
            yield gang
        finally:
            self.give_back(gang.addresses)


class Gang:
    """The workers one trial holds: a :class:`damptune.cluster.WorkerGroup` whose lost workers
    are replaced from the pool's free ones (never from another trial's)."""

    def __init__(self, pool: WorkerPool, addresses: list[str]) -> None:
        self.pool, self.addresses, self.size = pool, addresses, len(addresses)

    def replace(self, dead: set[str], *, need: int, timeout: float) -> list[str]:
        """As :meth:`damptune.cluster.WorkerGroup.replace`, waiting at most the pool's
        ``worker_wait`` (the grid's: how long a trial waits for workers), not the engine's
        longer rank ``timeout``: a cluster with no workers left stops the trial's attempt then,
        as it does a trial that waits to start."""
        live = set(self.pool.live())
        gone = [w for w in self.addresses if w in dead or w not in live]
        self.pool.give_back(gone, lost=True)
        kept = [w for w in self.addresses if w not in gone]
        missing = self.size - len(kept)
        if missing > 0:  # back to full size if free workers are there; wait only for need
            kept += self.pool.take(missing, at_least=max(0, need - len(kept)),
                                   timeout=min(timeout, self.pool.timeout), have=len(kept))
        self.addresses = kept
        return kept


def check_cluster(source: str) -> None:
    """Refuse a bad ``cluster`` before any work: not ``local``, an address or an existing
    YAML file; a YAML file that :func:`tasks.cluster_yaml.read_cluster_yaml` refuses (a
    syntax error, not a mapping, a class that does not import or is not a cluster class, a
    keyword the class, or the workers it passes keywords on to, does not take)."""
    if source == "local" or source.startswith(("tcp://", "tls://", "ws://")):
        return
    if not (source.endswith((".yaml", ".yml")) and os.path.isfile(source)):
        raise ConfigError("cluster", source,
                          "'local', a scheduler address 'tcp://HOST:PORT' or a cluster YAML file")
    read_cluster_yaml(source)


def _from_yaml(path: str, n_workers: int) -> Any:
    spec = read_cluster_yaml(path)
    cluster = spec.cls(**spec.kwargs)
    cluster.scale(spec.workers or n_workers)
    return cluster


@contextlib.contextmanager
def open_cluster(source: str, *, n_workers: int, local_directory: str,
                 wait_timeout: float = 300.0, worker_wait: float = 600.0,
                 device: str = "cpu") -> Iterator[WorkerPool]:
    """Open the cluster for a flow run: its live worker pool, until the ``with`` block ends.
    ``device``: where ranks train; ``local`` starts one worker per GPU for ``cuda``/``auto``
    when this machine has GPUs (:func:`tasks.gpus.local_cluster_for`).

    Every worker (and every worker that joins later) gets the preemption plugin: a SIGTERM
    retires it gracefully and its trial checkpoints. ``worker_wait``: how long a trial waits
    for the workers it needs before it is interrupted (a fault of the cluster, retried).
    """
    owned: Any = None
    if source == "local":
        owned = local_cluster_for(device, n_workers=n_workers, local_directory=local_directory)
        address = owned.scheduler_address
    elif source.startswith(("tcp://", "tls://", "ws://")):
        address = source
    elif source.endswith((".yaml", ".yml")) and os.path.exists(source):
        owned = _from_yaml(source, n_workers)
        address = owned.scheduler_address
    else:
        raise ConfigError("cluster", source,
                          "'local', a scheduler address 'tcp://HOST:PORT' or a cluster YAML file")
    client = Client(address, timeout="30s", set_as_default=False)
    try:
        client.register_plugin(PreemptionPlugin())
        client.register_plugin(membership.MembershipPlugin())
        client.register_plugin(claims.ClaimsPlugin())
        try:
            client.wait_for_workers(n_workers, timeout=wait_timeout)
        except TimeoutError as exc:
            have = len(worker_addresses(client))
            raise ClusterError(f"the cluster at {address} offered {have} of the {n_workers} "
                               f"workers the grid needs within {wait_timeout:g} s") from exc
        yield WorkerPool(client, timeout=worker_wait)
    finally:
        client.close()
        if owned is not None:
            owned.close()


def cluster_started(pool: WorkerPool) -> float:
    """When the cluster's scheduler started (``time.time()``): the clock of
    ``max_cluster_lifetime``."""
    info = pool.client.scheduler_info(n_workers=0)
    return float(info.get("started") or time.time())
