"""Argument checks shared by the model constructors (private)."""

from __future__ import annotations

import operator


def _as_int(value: object) -> int | None:
    """Return ``value`` as an int if it is an integer (not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def check_int(param: str, value: object, *, minimum: int = 1, what: str = "") -> int:
    """Return ``value`` as an int, or raise ValueError naming ``param`` if it is not >= minimum."""
    as_int = _as_int(value)
    if as_int is None or as_int < minimum:
        suffix = f" ({what})" if what else ""
        raise ValueError(
            f"{param}={value!r} is not accepted; expected an int >= {minimum}{suffix}."
        )
    return as_int


def check_shape(input_shape: object, *, ndims: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Return ``input_shape`` as a tuple of ints, or raise ValueError naming ``input_shape``.

    Args:
        input_shape: The shape of one example, without the batch dimension.
        ndims: Accepted numbers of dimensions; None accepts any number >= 1.
    """
    dims = [_as_int(s) for s in input_shape] if isinstance(input_shape, tuple | list) else []
    ok = bool(dims) and all(d is not None and d >= 1 for d in dims)
    if ok and ndims is not None:
        ok = len(dims) in ndims
    if not ok:
        n = "any number of" if ndims is None else " or ".join(str(k) for k in ndims)
        raise ValueError(
            f"input_shape={input_shape!r} is not accepted; expected a tuple of {n} positive "
            "ints, the shape of one example without the batch dimension, e.g. (40,) for "
            "mnist1d or (1, 8, 8) for digits (Dataset.input_shape gives it)."
        )
    return tuple(int(d) for d in dims)  # type: ignore[arg-type]
