"""The log a task's lines go to: its Prefect run's, or ``damptune.tasks`` outside a run."""

from __future__ import annotations

import logging

__all__ = ["run_logger"]


def run_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """Prefect's run logger inside a flow or task run (its lines reach that run's logs in the
    UI); the ``damptune.tasks`` logger outside one (a test, a script, the engine's callers)."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run context
        return logging.getLogger("damptune.tasks")
