"""What lives in a Dask worker process: cached data and models, keyed by run.

Functions here run on workers; they receive plain values (config dicts, arrays, the scattered
data) and keep per-run objects in a module-level registry, so the data travels to a worker once
and a model is built once per worker per run.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from damptune.config import TrainConfig
from damptune.state import TrainData, build_model, resolve_device

__all__ = ["local_data", "local_model", "forget", "registry"]

_LOCK = threading.Lock()
_REGISTRY: dict[str, dict[str, Any]] = {}
_THREADS_SET = False


def registry(run_key: str) -> dict[str, Any]:
    """The per-run dict of this process (created on first use)."""
    global _THREADS_SET
    with _LOCK:
        if not _THREADS_SET:
            # one rank per single-threaded worker: no oversubscription of the cores
            torch.set_num_threads(1)
            _THREADS_SET = True
        return _REGISTRY.setdefault(run_key, {})


def local_data(run_key: str, data: TrainData, config: TrainConfig) -> TrainData:
    """The run's data on this worker's device (moved once)."""
    reg = registry(run_key)
    if "data" not in reg:
        reg["data"] = data.to(resolve_device(config))
    return reg["data"]


def local_model(run_key: str, config: TrainConfig) -> torch.nn.Module:
    """The run's model on this worker (built once; weights are overwritten by the caller)."""
    reg = registry(run_key)
    if "model" not in reg:
        reg["model"] = build_model(config).to(resolve_device(config))
    return reg["model"]


def forget(run_key: str) -> bool:
    """Drop everything this process holds for ``run_key``."""
    with _LOCK:
        return _REGISTRY.pop(run_key, None) is not None
