"""Where each rank trains: its device, and the backend of the ranks' process group.

The driver decides the *placement* once per formation of a group (not per update), from what
the ranks' Dask workers report (:func:`worker_report`: host, ``CUDA_VISIBLE_DEVICES``, the
number of CUDA devices the worker sees); :func:`damptune.ranks.rank_setup` applies it. The
decision itself is pure (:func:`place_ranks`), so it is tested everywhere, GPUs or not.

Rules:

* ``device`` is ``cpu``, ``cuda`` (every rank on a GPU: a worker without one is a
  :class:`ConfigError`), ``cuda:N`` (every rank on the N-th device its worker sees) or ``auto``
  (CUDA when every worker of the group has a GPU, else every rank on CPU).
* A rank uses the GPU of its Dask worker. A worker started with ``CUDA_VISIBLE_DEVICES``
  (dask-cuda's ``LocalCUDACluster``, damptune's local GPU cluster, or
  ``CUDA_VISIBLE_DEVICES=2 dask worker ...``) sees its own GPU as ``cuda:0``: the first of its
  list. Otherwise the rank takes ``cuda:L``, L its *local rank*: its index among the group's
  ranks on the same host (not ``rank % device_count``, which puts ranks of different hosts,
  or two ranks of one host, on the wrong or the same GPU).
* Two ranks never share a GPU unless ``share_gpus`` is set (a :class:`ConfigError` naming
  ``share_gpus`` says which ranks would).
* The backend (``backend="auto"``): NCCL only when every rank has a GPU of its own; gloo on
  CPU, and gloo with a warning when ranks share a GPU (NCCL needs one GPU per rank).
  ``backend="gloo"`` is always accepted; ``backend="nccl"`` where NCCL cannot run is a
  :class:`ConfigError` naming ``backend``.

The local rank sees only the group's own ranks: two trials whose unpinned workers share a
multi-GPU host may both take its first GPUs. Give each worker its own GPU
(``CUDA_VISIBLE_DEVICES``) when trials run concurrently; :func:`unpinned_gpu_hosts` finds the
hosts where they do not.

Example:
    >>> two_gpus = [WorkerReport(f"tcp://a:{port}", "a", None, 2) for port in (1, 2)]
    >>> place_ranks("auto", two_gpus)
    Placement(devices=('cuda:0', 'cuda:1'), backend='nccl', note='')
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from damptune.errors import ConfigError

__all__ = ["WorkerReport", "Placement", "DEVICES", "BACKENDS", "parse_device", "local_ranks",
           "place_ranks", "choose_backend", "cpu_placement", "this_process_device",
           "worker_report", "unpinned_gpu_hosts"]

DEVICES = "'cpu', 'cuda', 'cuda:N' or 'auto'"
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class WorkerReport:
    """What one Dask worker says about its GPUs (:func:`worker_report` makes it there)."""

    address: str
    host: str
    visible: str | None  # CUDA_VISIBLE_DEVICES as the worker sees it (None: not set)
    device_count: int  # torch.cuda.device_count() in the worker

    @property
    def pinned(self) -> bool:
        """The worker was started with its own list of GPUs: its GPU is ``cuda:0``."""
        return bool(self.visible_ids) and self.device_count > 0

    @property
    def visible_ids(self) -> list[str]:
        """The entries of ``CUDA_VISIBLE_DEVICES`` (ids or UUIDs), in order."""
        return [s.strip() for s in (self.visible or "").split(",") if s.strip()]


@dataclass(frozen=True)
class Placement:
    """Each rank's device (rank r trains on ``devices[r]``) and the group's backend;
    ``note`` says why, when the choice deserves a warning (gloo on shared GPUs, CPU chosen
    by ``auto`` because a worker has no GPU)."""

    devices: tuple[str, ...]
    backend: str
    note: str = ""


def parse_device(device: Any) -> tuple[str, int | None]:
    """``"cpu"`` → ``("cpu", None)``, ``"cuda:1"`` → ``("cuda", 1)``, ``"cuda"``/``"auto"``
    → ``(device, None)``; anything else is a :class:`ConfigError` naming ``device``."""
    if device in ("cpu", "cuda", "auto"):
        return str(device), None
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return "cuda", int(device[5:])
    raise ConfigError("device", device, DEVICES)


def local_ranks(hosts: Sequence[str]) -> list[int]:
    """Each rank's index among the ranks on its host, in rank order.

    Example:
        >>> local_ranks(["a", "b", "a", "b", "a"])
        [0, 0, 1, 1, 2]
    """
    seen: Counter[str] = Counter()
    out = []
    for host in hosts:
        out.append(seen[host])
        seen[host] += 1
    return out


def cpu_placement(world: int, *, backend: str = "auto") -> Placement:
    """Every rank on CPU, with gloo (``backend="nccl"`` is refused: NCCL has no CPU)."""
    chosen, note = choose_backend(["cpu"] * world, requested=backend)
    return Placement(("cpu",) * world, chosen, note)


def place_ranks(device: str, reports: Sequence[WorkerReport], *, share_gpus: bool = False,
                backend: str = "auto") -> Placement:
    """The placement of ``len(reports)`` ranks, rank r on the worker of ``reports[r]``.

    Raises:
        ConfigError: ``device`` names CUDA and a worker has none, or ``cuda:N`` beyond what a
            worker sees (naming ``device``); two ranks would share a GPU without
            ``share_gpus`` (naming ``share_gpus``); ``backend="nccl"`` where NCCL cannot run.
    """
    kind, index = parse_device(device)
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, f"one of {list(BACKENDS)}")
    world = len(reports)
    if kind == "cpu":
        return cpu_placement(world, backend=backend)
    without = [r for r in reports if r.device_count == 0]
    if without and kind == "auto":
        placement = cpu_placement(world, backend=backend)
        if len(without) == world:
            return placement
        return Placement(placement.devices, placement.backend,
                         f"device='auto': {_workers(without)} report no CUDA device, so all "
                         f"{world} ranks train on CPU")
    if without:
        raise ConfigError("device", device, f"'cpu' or 'auto' ({_workers(without)} report no "
                          "CUDA device)", _NO_CUDA)
    devices, gpus = _gpus(device, index, reports)
    shared = _shared(gpus)
    if shared and not share_gpus:
        raise ConfigError("share_gpus", share_gpus, "True to let ranks share a GPU (they then "
                          "use gloo: NCCL needs one GPU per rank), or one GPU per rank",
                          f"device={device!r} puts {shared}.")
    chosen, note = choose_backend(devices, gpus=gpus, requested=backend)
    return Placement(tuple(devices), chosen, note)


_NO_CUDA = ("torch.cuda.device_count() is 0 there: a CPU build of torch (see `make "
            "setup-gpu`), no GPU, or CUDA_VISIBLE_DEVICES hiding them.")


def _workers(reports: Sequence[WorkerReport]) -> str:
    names = ", ".join(f"{r.address} (host {r.host})" for r in reports[:3])
    more = f" and {len(reports) - 3} more" if len(reports) > 3 else ""
    return f"worker(s) {names}{more}"


def _gpus(device: str, index: int | None, reports: Sequence[WorkerReport],
          ) -> tuple[list[str], list[tuple[str, str]]]:
    """Each rank's device, and the GPU it is on as ``(host, physical id)``."""
    unpinned = [r.host for r in reports if not r.pinned]
    local = iter(local_ranks(unpinned))
    devices, gpus = [], []
    for report in reports:
        here = None if report.pinned else next(local)
        if index is not None:
            if index >= report.device_count:
                raise ConfigError("device", device, f"a device its workers have: "
                                  f"{report.address} sees {report.device_count} CUDA device(s)")
            ordinal = index
        else:
            ordinal = 0 if here is None else here % report.device_count
        ids = report.visible_ids if report.pinned else []
        devices.append(f"cuda:{ordinal}")
        gpus.append((report.host, ids[ordinal] if ordinal < len(ids) else str(ordinal)))
    return devices, gpus


def _shared(gpus: Sequence[tuple[str, str]]) -> str:
    """Which ranks would share a GPU, in words ('' if none)."""
    parts = []
    for gpu, count in Counter(gpus).items():
        if count > 1:
            ranks = [r for r, g in enumerate(gpus) if g == gpu]
            parts.append(f"ranks {ranks} on GPU {gpu[1]} of host {gpu[0]}")
    return "; ".join(parts)


def choose_backend(devices: Sequence[str], *, gpus: Sequence[tuple[str, str]] | None = None,
                   requested: str = "auto") -> tuple[str, str]:
    """The backend of ranks on ``devices`` (``gpus``: the physical GPU of each, to find
    shared ones; default the device names), and a note when ``auto`` fell back to gloo on
    GPUs. NCCL only when every rank has a GPU of its own.

    Example:
        >>> choose_backend(["cuda:0", "cuda:0"])
        ('gloo', '2 ranks on 1 GPU: NCCL needs one GPU per rank; using gloo')
        >>> choose_backend(["cuda:0", "cuda:1"])
        ('nccl', '')
    """
    on_gpu = bool(devices) and all(d.startswith("cuda") for d in devices)
    keys = list(gpus) if gpus is not None else [("", d) for d in devices]
    distinct = len(set(keys))
    reason = ""
    if not on_gpu:
        reason = "NCCL needs every rank on a GPU"
    elif distinct < len(keys):
        reason = (f"{len(keys)} ranks on {distinct} GPU{'s' if distinct > 1 else ''}: NCCL "
                  "needs one GPU per rank")
    if requested == "nccl" and reason:
        raise ConfigError("backend", requested, "'auto' or 'gloo'", f"{reason}.")
    if requested == "gloo" or reason:
        return "gloo", f"{reason}; using gloo" if on_gpu and requested == "auto" else ""
    return "nccl", ""


def this_process_device(device: str, *, device_count: int | None = None) -> torch.device:
    """The device of a run in this process (``local`` mode, a calibration here): ``auto``
    is ``cuda:0`` when this process sees a GPU, else CPU; ``cuda``/``cuda:N`` need one."""
    kind, index = parse_device(device)
    count = torch.cuda.device_count() if device_count is None else device_count
    if kind == "cpu" or (kind == "auto" and count == 0):
        return torch.device("cpu")
    if count == 0 or (index or 0) >= count:
        raise ConfigError("device", device, f"'cpu' or 'auto' (this process sees {count} CUDA "
                          "device(s))", _NO_CUDA)
    return torch.device("cuda", index or 0)


def worker_report(dask_worker: Any = None) -> WorkerReport:
    """On a Dask worker (a task, or ``client.run``): its address, host, CUDA_VISIBLE_DEVICES
    and the number of CUDA devices it sees."""
    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    return WorkerReport(address=str(dask_worker.address), host=socket.gethostname(),
                        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                        device_count=int(torch.cuda.device_count()))


def unpinned_gpu_hosts(reports: Sequence[WorkerReport]) -> list[str]:
    """Hosts with several GPU workers that were not given their own GPU: concurrent trials
    on such a host may land on the same GPUs (each trial places its own ranks only)."""
    counts = Counter(r.host for r in reports if r.device_count > 0 and not r.pinned)
    return sorted(h for h, n in counts.items() if n > 1)
