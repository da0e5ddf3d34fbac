"""Names of a package imported on first use (PEP 562 ``__getattr__``): importing the package,
or one of its light modules, does not import its heavy ones (torch, scikit-learn, Prefect)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` map a module to the names
    it gives the package; a name is imported from its module once, then kept."""
    module_of = {name: module for module, names in exports.items() for name in names}
    clashes = [name for name, module in module_of.items() if module.endswith(f".{name}")]
    if clashes:  # once the module is imported, the package's attribute is the module
        raise ValueError(f"{package}: names that are also their module's name: {clashes}")

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    getattr_.exported = module_of  # type: ignore[attr-defined]
    return getattr_, dir_
