"""One retry loop for the pipeline's stores (the Optuna storage, MLflow): exponential backoff
over transient errors, a clear error when they outlast the attempts, anything else at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["retry"]

T = TypeVar("T")


def retry(fn: Callable[[], T], *, transient: Callable[[Exception], bool],
          give_up: Callable[[Exception], Exception] | None = None, attempts: int,
          delay: float) -> T:
    """Call ``fn``; on an error ``transient`` accepts, wait ``delay · 2^k`` and call again, at
    most ``attempts`` times in all, then raise ``give_up(error)`` from it (the error itself
    without ``give_up``). Other errors propagate unchanged."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if not transient(exc):
                raise
            if attempt == attempts - 1:
                if give_up is None:
                    raise
                raise give_up(exc) from exc
            time.sleep(delay * 2**attempt)
    raise AssertionError("unreachable")
