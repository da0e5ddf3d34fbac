"""Connect to a Dask cluster: a local one made on demand, a scheduler address, or a client."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import dask
from distributed import Client, LocalCluster

from damptune.errors import ClusterError, ConfigError
from damptune.quiet import QUIET_CONFIG, QuietScheduler, QuietWorker, in_step
from damptune.state import TrainData

__all__ = ["connect", "worker_addresses", "scatter_data", "local_cluster", "gather_within",
           "WorkerGroup", "ClusterWorkers", "live_workers", "scheduler_address", "QUIET_CONFIG"]

# What a rank's worker process imports before its first task (torch, torch._dynamo, which
# torch.optim imports at the first step, the engine): ~5 s of CPU per process when each worker
# is a fresh interpreter (Dask's default, "spawn"). A local cluster's workers are forked from
# one "forkserver" process that imported them once, so a worker costs a fork
# (tests/damptune/test_local_cluster.py). The server starts with the first worker and keeps
# the environment it started with: set variables the workers read before the first local
# cluster. A worker that a nanny restarts later is spawned (Dask's default) as before.
FORKSERVER_PRELOAD = ["distributed", "numpy", "torch", "torch._dynamo", "damptune.ranks"]
FORKSERVER = {"distributed.worker.multiprocessing-method": "forkserver"}


def _preload_forkserver() -> None:
    """Set this process's forkserver preload (once: the server starts with the first worker,
    and keeps the environment and modules it started with)."""
    from distributed.utils import get_mp_context

    with dask.config.set(FORKSERVER):
        context = get_mp_context()  # Dask sets its own preload list the first time
    context.set_forkserver_preload(FORKSERVER_PRELOAD + _main_module())


def _main_module() -> list[str]:
    """The main module's name, where this process was started as ``python -m NAME`` (a flow
    run of Prefect's process worker is ``python -m prefect.engine``): multiprocessing runs
    the main module again in every worker it starts, as ``__mp_main__``, and so its imports
    (all of Prefect: ~2.4 s of CPU) in each. Imported once in the forkserver, each worker
    finds them imported. A ``NAME.__main__`` (``python -m damptune``, pytest) is not run
    again; a script's path is run again, and is left out."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    return [name] if name and not (name == "__main__" or name.endswith(".__main__")) else []


def local_cluster(*, n_workers: int, local_directory: str | None = None) -> LocalCluster:
    """A LocalCluster of single-threaded worker processes bound to 127.0.0.1, whose idle Dask
    work is slowed (``damptune.quiet``: 16 idle workers: ~4 % of a core -> 0.8 %)."""
    directory = local_directory or os.path.join(os.getcwd(), "runs", "dask-scratch")
    os.makedirs(directory, exist_ok=True)
    _preload_forkserver()
    with dask.config.set({**QUIET_CONFIG, **FORKSERVER}):  # scheduler, nannies, workers
        cluster = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            local_directory=directory,
            silence_logs=40,  # logging.ERROR
            scheduler_kwargs={"plugins": [QuietScheduler()]},
            scheduler_sync_interval=5,  # s, the cluster object's info to the scheduler (Dask: 1)
            plugins=[QuietWorker()],  # passed by each nanny to its worker
        )
    # the scheduler and the nannies share this loop: their timers started one by one
    cluster.sync(in_step, cluster.scheduler, list(cluster.workers.values()))
    return cluster


@contextlib.contextmanager
def connect(
    cluster: Any, *, n_workers: int, local_directory: str | None = None
) -> Iterator[Client]:
    """Yield a client for ``cluster``; what this function starts, it also stops.

    ``cluster`` is None (start a LocalCluster of ``n_workers``), a scheduler address string,
    a ``distributed.Client`` or a Dask cluster object.
    """
    if isinstance(cluster, Client):
        yield cluster
        return
    owned: Any = None
    if cluster is None:
        owned = cluster = local_cluster(n_workers=n_workers, local_directory=local_directory)
    if isinstance(cluster, str):
        client = Client(cluster, timeout="30s", set_as_default=False)
    elif hasattr(cluster, "scheduler_address"):
        client = Client(cluster, set_as_default=False)
    else:
        raise ConfigError(
            "cluster", cluster, "None, a scheduler address, a distributed.Client or a cluster"
        )
    try:
        yield client
    finally:
        client.close()
        if owned is not None:
            owned.close()


def scheduler_address(client: Client) -> str:
    """The address of the client's scheduler (for messages)."""
    return str(getattr(client.scheduler, "address", "") or "the scheduler")


def worker_addresses(client: Client) -> list[str]:
    """Addresses of the cluster's workers, sorted (rank r goes to the r-th)."""
    return sorted(client.scheduler_info(n_workers=-1)["workers"])


def live_workers(client: Client, ours: list[str], *, known: set[str],
                 dead: set[str] | None = None) -> tuple[list[str], list[str]]:
    """After a run lost workers: ``(ours still alive, workers that joined since)``, the
    latter sorted. ``known`` are the addresses the run ever saw (a dead one never comes back:
    a replacement has a new address); ``dead`` are the ones it just saw fail."""
    gone = dead or set()
    current = worker_addresses(client)
    alive = [w for w in ours if w in current and w not in gone]
    fresh = sorted(w for w in current if w not in known and w not in ours and w not in gone)
    return alive, fresh


@runtime_checkable
class WorkerGroup(Protocol):
    """The workers one run trains on, which may change while it runs: rank r is on the r-th
    of ``addresses``. A lost worker is replaced through :meth:`replace`, so whoever shares the
    cluster between runs (``tasks.clusters.WorkerPool``) decides which workers a run may take.
    """

    addresses: list[str]

    def replace(self, dead: set[str], *, need: int, timeout: float) -> list[str]:
        """Drop ``dead`` (and any worker that left); add live workers the run may use, back up
        to the group's size; wait up to ``timeout`` s for at least ``need``. Returns the new
        ``addresses``, or raises :class:`ClusterError` naming the counts."""
        ...


class ClusterWorkers:
    """A :class:`WorkerGroup` of a run that has the cluster to itself: a replacement is a
    worker that joined after the run started (a dead worker never comes back: its replacement
    has a new address)."""

    def __init__(self, client: Client, addresses: list[str]) -> None:
        self.client, self.addresses, self.size = client, list(addresses), len(addresses)
        self.known = set(worker_addresses(client))

    def replace(self, dead: set[str], *, need: int, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            alive, fresh = live_workers(self.client, self.addresses, known=self.known, dead=dead)
            self.addresses = (alive + fresh)[: max(need, self.size)]
            if len(self.addresses) >= need:
                return self.addresses
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the cluster at {scheduler_address(self.client)} has "
                    f"{len(self.addresses)} live worker(s) for this run after losing "
                    f"{sorted(dead) or 'a worker'}; it needs {need} (waited {timeout:g} s)")
            time.sleep(0.5)


# one scattered copy per (client, dataset): every run of this process that shares a client
# shares it; keyed by the client's id since futures die with their client (entries of closed
# clients are dropped)
_SCATTERED: dict[tuple[str, str], Any] = {}


def scatter_data(client: Client, data: TrainData, *, workers: list[str] | None = None,
                 again: bool = False) -> Any:
    """Send the data to ``workers`` (default: every worker) once per client; return its
    future. A task on another worker fetches it from one that holds it.

    ``again``: send it anew even if the cached future still looks finished (the scheduler
    reported it lost with a dead worker before its status changed here)."""
    for old in [k for k, f in _SCATTERED.items() if f.client.status in ("closing", "closed")]:
        del _SCATTERED[old]
    digest = hashlib.sha1()
    for t in (data.X, data.y, data.X_test, data.y_test):
        if t is not None:
            digest.update(str(tuple(t.shape)).encode())
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    key = (client.id, digest.hexdigest())
    if again or key not in _SCATTERED or _SCATTERED[key].status != "finished":
        # first time, or every worker holding it died: send it again from here
        _SCATTERED[key] = client.scatter(data, workers=workers, broadcast=True, hash=False)
    return _SCATTERED[key]


def gather_within(futures: list[Any], *, timeout: float, what: str,
                  client: Client | None = None, workers: list[str] | None = None) -> list[Any]:
    """Results of ``futures`` in order. Raises the first error a future raised as soon as it
    does (not after earlier futures finish), :class:`ClusterError` if one of ``workers`` (the
    workers the futures run on) left the cluster — its future would wait for it for ever — or
    if they take longer than ``timeout``."""
    deadline = time.monotonic() + timeout
    changed = threading.Event()
    for f in futures:
        f.add_done_callback(lambda _: changed.set())
    waited = 0.0
    while True:
        changed.clear()
        for f in futures:
            if f.status == "error":
                f.result()  # raises the rank's own error
        if all(f.status == "finished" for f in futures):
            results = _fetched(futures, min(_FETCH_SECONDS, deadline - time.monotonic()))
            if results is not None:
                return results
        if time.monotonic() >= deadline:
            _cancel(futures)
            raise ClusterError(f"{what}: ranks did not answer within timeout={timeout} s")
        if not changed.wait(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
            waited += _POLL_SECONDS
            if client is not None and workers and waited >= 2 * _POLL_SECONDS:
                gone = sorted(set(workers) - set(worker_addresses(client)))
                if gone:
                    _cancel(futures)
                    raise ClusterError(f"{what}: worker(s) {gone} left the cluster")


_POLL_SECONDS = 1.0  # how often a wait looks for errors and lost workers
_FETCH_SECONDS = 10.0  # the longest one try to fetch finished results may take


def _fetched(futures: list[Any], timeout: float) -> list[Any] | None:
    """The finished futures' results, or None if fetching them stalls. A result held by a
    worker that died after finishing is lost: Dask would recompute it on that worker alone
    (a rank is pinned to its worker), so an unbounded fetch would wait for ever; the caller
    looks again (the lost future is no longer finished, and its worker is gone)."""
    try:
        return [f.result(timeout=max(timeout, _POLL_SECONDS)) for f in futures]
    except TimeoutError:
        return None


def _cancel(futures: list[Any]) -> None:
    for f in futures:
        f.cancel()
