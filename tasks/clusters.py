"""Where trials train: one Dask cluster per flow run, shared by trials that gang-allocate it.

Sources (the flow's ``cluster`` parameter):

* ``"local"`` — a ``LocalCluster`` of single-threaded worker processes on 127.0.0.1, as many
  as the largest network size, started once per flow run (no trial pays its start-up);
* ``"tcp://HOST:PORT"`` — an existing scheduler (its workers must already be there);
* a YAML file (e.g. ``infra/cluster-slurm.yaml``) naming any Dask cluster class by import path
  with its keyword arguments: ``{class: dask_jobqueue.SLURMCluster, kwargs: {...}}``; it is
  scaled to the largest network size.

A trial of network size P acquires P workers at once (all or nothing, so two trials never
deadlock holding half of what each needs) and releases them when it ends.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import yaml
from distributed import Client

from damptune import ClusterError, ConfigError
from damptune.cluster import local_cluster, worker_addresses

__all__ = ["WorkerPool", "open_cluster"]


class WorkerPool:
    """Gang allocation of a cluster's workers among concurrent trials."""

    def __init__(self, address: str, workers: list[str]) -> None:
        self.address = address
        self._free = list(workers)
        self._all = list(workers)
        self._cond = threading.Condition()

    @property
    def size(self) -> int:
        return len(self._all)

    @contextlib.contextmanager
    def acquire(self, n: int, *, timeout: float = 3600.0) -> Iterator[list[str]]:
        """Hold ``n`` workers (sorted addresses) for the duration of the ``with`` block."""
        if n > len(self._all):
            raise ClusterError(f"a trial needs {n} workers but the cluster has {len(self._all)}")
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._free) < n:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(timeout=left):
                    raise ClusterError(f"no {n} free workers within {timeout} s")
            taken = sorted(self._free)[:n]
            for w in taken:
                self._free.remove(w)
        try:
            yield taken
        finally:
            with self._cond:
                self._free.extend(taken)
                self._cond.notify_all()


def _from_yaml(path: str, n_workers: int) -> Any:
    with open(path) as f:
        spec = yaml.safe_load(f) or {}
    if not isinstance(spec, dict) or "class" not in spec:
        raise ConfigError("cluster", path, "a YAML file with 'class' (import path) and 'kwargs'")
    module, _, name = str(spec["class"]).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError("cluster", spec["class"],
                          "an importable Dask cluster class (is its package installed?)") from exc
    cluster = cls(**(spec.get("kwargs") or {}))
    cluster.scale(int(spec.get("workers") or n_workers))
    return cluster


@contextlib.contextmanager
def open_cluster(source: str, *, n_workers: int, local_directory: str,
                 wait_timeout: float = 300.0) -> Iterator[WorkerPool]:
    """Open the cluster for a flow run: its worker pool, until the ``with`` block ends."""
    owned: Any = None
    if source == "local":
        owned = local_cluster(n_workers=n_workers, local_directory=local_directory)
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
        client.wait_for_workers(n_workers, timeout=wait_timeout)
        yield WorkerPool(address, worker_addresses(client))
    except TimeoutError as exc:
        raise ClusterError(f"the cluster at {address} did not offer {n_workers} workers within "
                           f"{wait_timeout} s") from exc
    finally:
        client.close()
        if owned is not None:
            owned.close()
