"""Import paths: how classes and functions travel in configurations and to Dask workers."""

from __future__ import annotations

import importlib
from typing import Any

from damptune.errors import ConfigError

__all__ = ["import_path", "resolve"]


def import_path(obj: Any) -> str:
    """``"package.module:QualName"`` of a class or function (how it travels to workers)."""
    return f"{obj.__module__}:{obj.__qualname__}"


def resolve(path: str, *, param: str = "module", accepted: str = "") -> Any:
    """Inverse of :func:`import_path`; a ConfigError naming ``param`` if it does not import."""
    module, sep, name = path.partition(":")
    expected = accepted or "an import path 'package.module:Name'"
    if not sep or not module or not name:
        raise ConfigError(param, path, expected)
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(param, path, expected, f"({exc})") from exc
    return obj
