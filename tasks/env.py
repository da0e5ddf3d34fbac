"""The environment variables the pipeline reads, parsed and checked in one place.

* ``DAMPTUNE_LEASE_TTL``: seconds (> 0) after which a dead run's trial is taken over; 60;
* ``DAMPTUNE_SQLITE_TIMEOUT``: seconds (> 0) SQLite waits for a lock; 60;
* ``DAMPTUNE_CACHE``: a directory damptune can write to (made if missing), the datasets' and
  calibrations' cache; ``~/.cache/damptune``.

An unset or empty variable takes its default (after the ``;``).

:func:`check_environment` refuses a bad value before any work (the flow calls it where it checks
its parameters), with a :class:`ConfigError` naming the variable, the value given and what is
accepted. ``DAMPTUNE_CACHE`` is read where it is used (``models.datasets``, the engine's
``damptune.netmodel``): only checked here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from damptune import ConfigError

__all__ = ["LEASE_TTL", "SQLITE_TIMEOUT", "CACHE", "lease_ttl", "sqlite_timeout",
           "check_cache", "check_environment"]

LEASE_TTL = "DAMPTUNE_LEASE_TTL"
SQLITE_TIMEOUT = "DAMPTUNE_SQLITE_TIMEOUT"
CACHE = "DAMPTUNE_CACHE"


def _seconds(name: str, default: float) -> float:
    """``$name`` as a finite number of seconds > 0; ``default`` when unset or empty."""
    text = os.environ.get(name, "")
    if not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(name, text, "a positive number of seconds",
                          f"An environment variable: unset or empty means {default:g}.")
    return value


def lease_ttl() -> float:
    """Seconds after which a dead run's lease on a trial expires: ``$DAMPTUNE_LEASE_TTL``, 60."""
    return _seconds(LEASE_TTL, 60.0)


def sqlite_timeout() -> float:
    """Seconds SQLite waits for a lock: ``$DAMPTUNE_SQLITE_TIMEOUT``, default 60."""
    return _seconds(SQLITE_TIMEOUT, 60.0)


def check_cache() -> None:
    """Refuse a ``$DAMPTUNE_CACHE`` that is not a directory damptune can write to, or make
    (its nearest existing parent a writable directory). Nothing is created here."""
    text = os.environ.get(CACHE, "")
    if not text.strip():
        return
    path = Path(text).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    problem = None
    if not existing.is_dir():
        problem = f"{existing} is not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{existing} is not writable"
    if problem:
        raise ConfigError(CACHE, text, "a directory damptune can write to, or make (its "
                          "datasets' and calibrations' cache)",
                          f"{problem}. An environment variable: unset or empty means "
                          "~/.cache/damptune.")


def check_environment() -> None:
    """Refuse, before any work, a bad value of any variable of the module's table."""
    lease_ttl()
    sqlite_timeout()
    check_cache()
