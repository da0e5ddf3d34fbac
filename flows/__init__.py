"""Prefect flows: they only wire tasks together (grid → cells → trials)."""

from flows.tune import tune

__all__ = ["tune"]
