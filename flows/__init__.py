"""Prefect flows: they only wire tasks together (grid → cells → trials).

``tune`` is imported on first use (PEP 562): ``damptune`` loads ``flows.cli`` for every command
(its entry points), and only ``damptune tune`` needs Prefect, MLflow and the tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flows.tune import tune

__all__ = ["tune"]


def __getattr__(name: str) -> Any:
    if name != "tune":
        raise AttributeError(f"module 'flows' has no attribute {name!r}")
    from flows.tune import tune

    return tune
