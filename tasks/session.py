"""A flow run's session: what its cells and trials share while it runs.

The session owns the cluster's worker pool, the MLflow client, the leases of the Optuna
storage and the queue that draws trials' plots. The flow opens it; cells and trials receive its
key (a Prefect task parameter, shown in the UI) and look it up with :func:`session_for`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from mlflow.tracking import MlflowClient

from damptune import DamptuneError
from tasks import tracking
from tasks.clusters import WorkerPool, cluster_started, open_cluster
from tasks.gpus import check_workers
from tasks.grid import GridSettings
from tasks.leases import Leases, leases_for
from tasks.tracking import PlotQueue

__all__ = ["Session", "open_session", "session_for", "lifetime_deadline", "torch_threads"]


@dataclass(frozen=True)
class Session:
    """The shared, live objects of one flow run (see the module docstring)."""

    key: str
    pool: WorkerPool
    tracking: MlflowClient
    leases: Leases
    plots: PlotQueue


# Prefect task parameters are shown in its UI and name the task runs: tasks get the key, not
# the live session, and find it here (one entry per flow run open in this process)
_OPEN: dict[str, Session] = {}


@contextlib.contextmanager
def open_session(settings: GridSettings, *, key: str, cluster: str,
                 n_workers: int) -> Iterator[Session]:
    """Open the cluster and the clients of a flow run; close them (plots drawn) on exit.
    ``settings.deadline`` is set from ``max_cluster_lifetime``, counted from the cluster's
    start (see :func:`lifetime_deadline`). ``settings.device`` is checked against what the
    cluster's workers report, before any cell runs (:func:`tasks.gpus.check_workers`)."""
    with open_cluster(cluster, n_workers=n_workers, worker_wait=settings.worker_wait,
                      local_directory=os.path.join(settings.run_dir, "dask"),
                      device=settings.device) as pool, \
            torch_threads(None if settings.mode == "local" else 1):
        check_workers(pool.client, device=settings.device, n_workers=n_workers)
        if settings.max_cluster_lifetime:
            settings.deadline = lifetime_deadline(cluster_started(pool), settings)
        session = Session(key=key, pool=pool, tracking=tracking.client_for(settings.tracking_uri),
                          leases=leases_for(settings.storage), plots=PlotQueue())
        _OPEN[key] = session
        try:
            yield session
        finally:
            _OPEN.pop(key, None)
            session.plots.close()


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads of this process set to ``n`` for the block (None: unchanged).
    While trials train on the cluster's workers, the flow's process only fits the samplers'
    Gaussian processes (torch): with torch's default of one thread per core those fits ran on
    every core, against the workers' training, and a GP's ask took longer under that load
    (0.4-0.8 s against 0.25-0.5 s with one thread; docs/pipeline.md, "The search")."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def lifetime_deadline(started: float, settings: GridSettings) -> float:
    """When trials must checkpoint and stop: the cluster's start (its scheduler's, a
    ``time.time()``) plus ``max_cluster_lifetime``, less a margin of two checkpoint intervals
    (at least a minute, at most half the lifetime). Per-worker walltimes are the workers' own
    (``dask worker --lifetime``, see infra/cluster-slurm-spot.yaml): a retiring worker's trial
    checkpoints on the notice and continues on the others."""
    lifetime = settings.max_cluster_lifetime
    margin = min(max(60.0, 2 * settings.checkpoint_seconds), lifetime / 2)
    return started + lifetime - margin


def session_for(key: str) -> Session:
    """The session a flow run of this process opened under ``key``."""
    try:
        return _OPEN[key]
    except KeyError:
        raise DamptuneError(f"no session {key!r} is open in this process: cells and trials "
                            "run inside the flow run that opened it") from None
