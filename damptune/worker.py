"""Per-run objects kept in a Dask worker process (decentralized ranks, rendezvous stores).

Functions that run on workers receive plain values and keep what must outlive one task (the
rank's training state, its process group's store) in this module-level registry, keyed by run.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["forget", "registry"]

# Dask runs the ranks' functions on workers by reference: their live state stays in the worker
_LOCK = threading.Lock()
_REGISTRY: dict[str, dict[str, Any]] = {}


def registry(run_key: str) -> dict[str, Any]:
    """The per-run dict of this process (created on first use)."""
    with _LOCK:
        if not _REGISTRY:
            torch.set_num_threads(1)  # one rank per single-threaded worker: no oversubscription
        return _REGISTRY.setdefault(run_key, {})


def forget(run_key: str) -> bool:
    """Drop everything this process holds for ``run_key``."""
    with _LOCK:
        return _REGISTRY.pop(run_key, None) is not None
