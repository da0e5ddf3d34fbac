"""GPUs for the grid: a local cluster with a GPU per worker, and the check, when the session
opens, that the cluster's workers give every rank of the largest network a GPU of its own.

``device`` is validated against what the *workers* report (``damptune.devices``), not this
process: the flow may run on a machine without a GPU while its workers have them. On
``cluster="local"`` the workers run here, so this process's GPUs are theirs.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import dask
import torch
from distributed import Client, Nanny, Scheduler, SpecCluster

from damptune import ConfigError
from damptune.cluster import QUIET_CONFIG, local_cluster
from damptune.devices import Placement, place_ranks, unpinned_gpu_hosts, worker_report

__all__ = ["gpu_ids", "local_cluster_for", "pinned_gpu_cluster", "check_workers"]

log = logging.getLogger("damptune.tasks")


def gpu_ids() -> list[str]:
    """This machine's GPUs as ``CUDA_VISIBLE_DEVICES`` entries: the entries of this process's
    ``CUDA_VISIBLE_DEVICES`` if set, else ``0 .. device_count - 1``."""
    count = torch.cuda.device_count()
    visible = [s.strip() for s in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if s.strip()]
    return visible[:count] if visible else [str(i) for i in range(count)]


def _rotated(ids: list[str], i: int) -> str:
    """Worker i's ``CUDA_VISIBLE_DEVICES``: the list starting at its own GPU (as dask-cuda
    does), so the worker sees its GPU as ``cuda:0``."""
    return ",".join(ids[i:] + ids[:i])


def local_cluster_for(device: str, *, n_workers: int, local_directory: str) -> Any:
    """The flow's local cluster: on CPU (``device="cpu"``, or ``auto`` without a GPU here) a
    LocalCluster of single-threaded workers; on GPUs one worker per GPU, each with its own
    ``CUDA_VISIBLE_DEVICES`` (dask-cuda's ``LocalCUDACluster`` when it is importable, else
    :func:`pinned_gpu_cluster`).

    Raises:
        ConfigError: ``device="cuda"`` and this machine has no GPU (naming ``device``), or
            fewer GPUs than the largest network's ranks (naming ``networks``).
    """
    ids = gpu_ids() if device != "cpu" else []
    if not ids:
        if device == "cuda":
            raise ConfigError("device", device, "'cpu' or 'auto': cluster='local' runs its "
                              "workers here, and this machine sees no CUDA device",
                              "A CPU build of torch? `make setup-gpu` installs a CUDA build.")
        return local_cluster(n_workers=n_workers, local_directory=local_directory)
    if len(ids) < n_workers:
        raise ConfigError("networks", n_workers, f"at most {len(ids)} ranks with device="
                          f"{device!r} on cluster='local' (a GPU per rank; this machine has "
                          f"{len(ids)})", "Use device='cpu', or a cluster with more GPUs.")
    os.makedirs(local_directory, exist_ok=True)
    with dask.config.set(QUIET_CONFIG):  # idle workers cost nothing here either
        return _gpu_cluster(ids[:n_workers], local_directory=local_directory)


def _gpu_cluster(ids: list[str], *, local_directory: str) -> Any:
    n_workers = len(ids)
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        return pinned_gpu_cluster(ids, local_directory=local_directory)
    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(ids),
                            n_workers=n_workers, threads_per_worker=1, host="127.0.0.1",
                            dashboard_address=None, local_directory=local_directory,
                            silence_logs=logging.ERROR)


def pinned_gpu_cluster(ids: list[str], *, local_directory: str) -> SpecCluster:
    """A cluster on 127.0.0.1 of one single-threaded worker per GPU of ``ids``; worker i's
    nanny starts it with ``CUDA_VISIBLE_DEVICES`` rotated to start at ``ids[i]``."""
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False,
                                               "dashboard_address": ":0"}}
    workers = {
        f"gpu-{i}": {"cls": Nanny, "options": {
            "nthreads": 1, "host": "127.0.0.1", "local_directory": local_directory,
            "env": {"CUDA_VISIBLE_DEVICES": _rotated(ids, i)}}}
        for i in range(len(ids))
    }
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR,
                       name="damptune-gpus")


def check_workers(client: Client, *, device: str, n_workers: int) -> Placement | None:
    """Before any work: the placement of ``n_workers`` ranks on the cluster's first workers
    (as the largest network's trial would have it), from what they report; says in the log
    where they train. None for ``device="cpu"``.

    Raises:
        ConfigError: naming ``device``: ``cuda`` on workers without a GPU, or ranks that would
            share a GPU (the grid gives each rank a GPU of its own).
    """
    if device == "cpu":
        return None
    found: dict[str, Any] = client.run(worker_report)
    reports = sorted(found.values(), key=lambda r: r.address)
    try:
        plan = place_ranks(device, reports[:n_workers])
    except ConfigError as exc:
        if exc.param != "share_gpus":
            raise
        raise ConfigError("device", device, f"a GPU of its own for each of the {n_workers} "
                          "ranks of the largest network, or device='cpu'", str(exc)) from None
    log.info("device=%r: %d worker(s) checked; the largest network trains on %s with %s",
             device, len(reports), ", ".join(plan.devices), plan.backend)
    if plan.note:
        log.warning("%s", plan.note)
    hosts = unpinned_gpu_hosts(reports)
    if hosts:
        log.warning("the GPU workers of host(s) %s have no CUDA_VISIBLE_DEVICES of their own: "
                    "trials running at once there may use the same GPUs (give each worker "
                    "its own GPU, as dask-cuda does)", ", ".join(hosts))
    return plan
