"""The one place where parameter values are checked: each check raises :class:`ConfigError`
naming the parameter, the value given and what is accepted.

Example:
    >>> positive_int("trials", 3)
    3
    >>> choice("mode", "local", ("local", "centralized"))
    'local'
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from damptune.errors import ConfigError

__all__ = ["positive_int", "seed_int", "positive_float", "non_negative_float", "number_in",
           "choice", "workers_for_ranks"]


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def positive_int(param: str, value: Any, accepted: str = "a positive integer") -> int:
    """``value`` if it is an int ≥ 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(param, value, accepted)
    return value


def seed_int(param: str, value: Any) -> int:
    """``value`` if it is an int in ``[0, 2**32)`` (not a bool): a seed NumPy accepts."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise ConfigError(param, value, "an integer in [0, 2**32)")
    return value


def positive_float(param: str, value: Any, accepted: str = "a finite positive number") -> float:
    """``value`` as a float if it is a finite number > 0 (not a bool)."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ConfigError(param, value, accepted)
    return float(value)


def non_negative_float(param: str, value: Any,
                       accepted: str = "a finite non-negative number") -> float:
    """``value`` as a float if it is a finite number ≥ 0 (not a bool)."""
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ConfigError(param, value, accepted)
    return float(value)


def number_in(param: str, value: Any, low: float, high: float, accepted: str) -> float:
    """``value`` as a float if it is a finite number with ``low < value <= high``."""
    if not _is_number(value) or not math.isfinite(value) or not low < value <= high:
        raise ConfigError(param, value, accepted)
    return float(value)


def choice(param: str, value: Any, accepted: Iterable[Any]) -> Any:
    """``value`` if it is one of ``accepted``."""
    options = list(accepted)
    if value not in options:
        raise ConfigError(param, value, f"one of {options}")
    return value


def workers_for_ranks(param: str, value: int, *, mode: str, ranks: int, ranks_name: str,
                      unset: str) -> None:
    """``value`` workers for up to ``ranks`` ranks, fewer each running several ranks' shares:
    only ``centralized`` mode can; ``decentralized``'s all-reduce needs a worker per rank.
    ``unset`` is what the parameter takes for one worker per rank (``0``, ``None``)."""
    if mode == "decentralized" and 0 < value < ranks:
        raise ConfigError(param, value,
                          f"{unset} or at least {ranks_name} ({ranks}) with mode='decentralized', "
                          "whose all-reduce needs a worker per rank",
                          "Use mode='centralized' to run several ranks' shares on a worker.")
