"""Exceptions of damptune: one root class, errors that say what was wrong and what is accepted."""

from __future__ import annotations

from typing import Any

__all__ = ["DamptuneError", "ConfigError", "CheckpointError", "ClusterError", "StopTraining"]


class DamptuneError(Exception):
    """Root of every error damptune raises on purpose."""


class ConfigError(DamptuneError, ValueError):
    """A parameter has a value that is not accepted.

    The message names the parameter, the value given and what is accepted, so that the caller
    can fix the call without reading the source.
    """

    def __init__(self, param: str, given: Any, accepted: str, hint: str = "") -> None:
        self.param, self.given, self.accepted = param, given, accepted
        msg = f"{param}={given!r} is not accepted; expected {accepted}."
        if hint:
            msg += f" {hint}"
        super().__init__(msg)


class CheckpointError(DamptuneError):
    """A checkpoint is missing, unreadable, or belongs to another model or configuration."""


class ClusterError(DamptuneError, RuntimeError):
    """The Dask cluster cannot run the requested ranks (too few workers, a rank timed out...)."""


class StopTraining(Exception):  # noqa: N818 - a signal, not an error
    """Raise from an event callback to end training early (e.g. an Optuna pruner said so).

    `fit` then returns normally; the estimator's `stopped_` attribute holds the message.
    """
