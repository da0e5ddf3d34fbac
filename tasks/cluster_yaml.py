"""A cluster YAML file (the flow's ``cluster=<file.yaml>``), read and checked before any work.

The file is a mapping ``{class: <import path>, kwargs: {...}, workers: null | N}``. It is
refused, with a :class:`ConfigError` naming the file and what is wrong, when it does not read
as YAML (the line and column of a syntax error), is not such a mapping, its ``class`` does not
import or is not a Dask cluster class, ``workers`` is not null or a positive integer, or a key
of ``kwargs`` is one the class does not take.

A class's own signature is not enough for the last check: Dask's cluster classes take
``**kwargs`` and pass them on (a misspelt keyword of ``LocalCluster`` reaches its workers, which
then fail to start, each with a traceback). :func:`accepted_keywords` follows ``**kwargs`` where
they go: the next ``__init__`` of the class's MRO (cooperative ``super().__init__(**kwargs)``),
and, where Dask passes them elsewhere, to ``LocalCluster``'s worker class (``Nanny`` or
``Worker``), from a ``Nanny`` to its ``Worker``, from a ``Worker`` or ``Scheduler`` to
``Server``, from a dask-jobqueue cluster to its job class. Where it cannot tell (a signature
it cannot read, ``**kwargs`` left over at the end of the MRO) no keyword is refused. The
``{cls, options}`` specs of a ``SpecCluster`` (``scheduler``, ``worker``, ``workers``) have
their ``options`` checked against their ``cls`` the same way.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

import yaml

from damptune import ConfigError

__all__ = ["ClusterSpec", "read_cluster_yaml", "accepted_keywords"]

KEYS = ("class", "kwargs", "workers")
SHAPE = "a YAML mapping {class: <a Dask cluster class's import path>, kwargs: {...}, workers: N}"
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
# (class, its **name) -> the class that takes them, where that is not the next __init__ of the MRO
_PASSED_TO = {
    ("distributed.nanny.Nanny", "worker_kwargs"): "distributed.worker.Worker",
    ("distributed.worker.Worker", "kwargs"): "distributed.core.Server",
    ("distributed.scheduler.Scheduler", "kwargs"): "distributed.core.Server",
}


@dataclass(frozen=True)
class ClusterSpec:
    """A checked cluster YAML: the class, its keyword arguments, and its worker count (None:
    scaled to what the grid needs)."""

    cls: type
    kwargs: dict[str, Any]
    workers: int | None


def read_cluster_yaml(path: str) -> ClusterSpec:
    """The checked contents of the cluster YAML file at ``path`` (see the module docstring)."""
    spec = _read(path)
    cls = _cluster_class(path, spec["class"])
    kwargs = spec.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ConfigError("cluster", path, "'kwargs' as a mapping of keyword arguments",
                          f"It is a {type(kwargs).__name__}.")
    workers = spec.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 0):
        raise ConfigError("cluster", path, "'workers' null or 0 (scaled to what the grid "
                          "needs) or a positive integer", f"It is {workers!r}.")
    _check_keywords(path, spec["class"], cls, kwargs)
    return ClusterSpec(cls, kwargs, workers or None)


def _read(path: str) -> dict[str, Any]:
    """The file's mapping, with ``class`` and no key but :data:`KEYS`."""
    try:
        with open(path) as f:
            spec = yaml.safe_load(f)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError("cluster", path, SHAPE,
                          f"YAML syntax error{where}: {exc.problem or exc.context}.") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError("cluster", path, "a readable YAML file", str(exc)) from None
    if not isinstance(spec, dict):
        raise ConfigError("cluster", path, SHAPE, "The file holds "
                          + ("nothing." if spec is None else f"a {type(spec).__name__}, not a "
                             "mapping."))
    if "class" not in spec:
        raise ConfigError("cluster", path, SHAPE + ", with 'class'", "It has no 'class'.")
    unknown = sorted(set(map(str, spec)) - set(KEYS))
    if unknown:
        raise ConfigError("cluster", path, SHAPE + f", no key but {list(KEYS)}",
                          f"Unknown: {unknown}.{_hint(unknown, KEYS)}")
    return spec


def _import(dotted: Any) -> Any:
    """The object at a dotted import path (a str), else ImportError/AttributeError/ValueError."""
    if not isinstance(dotted, str):
        raise ValueError(f"{dotted!r} is not an import path")
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _cluster_class(path: str, dotted: Any) -> type:
    """The class ``dotted`` names: importable, and a cluster (``scale``, ``close`` and
    ``scheduler_address``, as ``distributed.deploy.Cluster`` and its subclasses have)."""
    try:
        cls = _import(dotted)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("cluster", path, "'class' naming an importable Dask cluster class "
                          "(is its package installed?)", f"class {dotted!r}: {exc}.") from None
    if not (isinstance(cls, type) and all(hasattr(cls, a) for a in
                                          ("scale", "close", "scheduler_address"))):
        raise ConfigError("cluster", path, "'class' naming a Dask cluster class (one with "
                          "scale(), close() and scheduler_address, as distributed.LocalCluster,"
                          " distributed.deploy.SpecCluster, dask_jobqueue.SLURMCluster)",
                          f"class {dotted!r} is not one.")
    return cls


def _check_keywords(path: str, dotted: str, cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse a key of ``kwargs`` that ``cls`` does not take, or an option of one of its
    ``{cls, options}`` specs that the spec's class does not take."""
    found = accepted_keywords(cls, kwargs)
    if found is not None:
        names, via = found
        unknown = sorted(set(map(str, kwargs)) - names)
        if unknown:
            passed = f" and those it passes on to {', '.join(via)}" if via else ""
            raise ConfigError("cluster", path, f"'kwargs' that {dotted} takes (its own{passed})",
                              f"Unknown: {unknown}.{_hint(unknown, names)}")
    for where, spec in _specs(kwargs):
        _check_spec(path, where, spec)


def _check_spec(path: str, where: str, spec: dict[str, Any]) -> None:
    """Refuse a ``{cls, options}`` spec whose ``cls`` does not import, or whose ``options``
    its class does not take."""
    try:
        cls = spec["cls"] if isinstance(spec["cls"], type) else _import(spec["cls"])
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("cluster", path, f"'{where}.cls' naming an importable class",
                          f"{spec['cls']!r}: {exc}.") from None
    options = spec.get("options") or {}
    found = accepted_keywords(cls, options) if isinstance(options, dict) else None
    if found is not None:
        unknown = sorted(set(map(str, options)) - found[0])
        if unknown:
            raise ConfigError("cluster", path, f"'{where}.options' that {spec['cls']} takes",
                              f"Unknown: {unknown}.{_hint(unknown, found[0])}")


def _specs(kwargs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ``{cls, options}`` specs among ``kwargs``' values, and among the values of a
    mapping value (``SpecCluster``'s ``workers``), with where they are."""
    found = []
    for key, value in kwargs.items():
        if _is_spec(value):
            found.append((f"kwargs.{key}", value))
        elif isinstance(value, dict):
            found += [(f"kwargs.{key}.{k}", v) for k, v in value.items() if _is_spec(v)]
    return found


def _is_spec(value: Any) -> bool:
    return isinstance(value, dict) and "cls" in value and set(value) <= {"cls", "options"}


def _hint(unknown: list[str], names: Any) -> str:
    """' Did you mean ...?' for the unknown keys close to an accepted one."""
    close = {u: m[0] for u in unknown if (m := difflib.get_close_matches(u, list(names), 1))}
    if not close:
        return ""
    return " Did you mean " + ", ".join(f"{m!r} for {u!r}" for u, m in close.items()) + "?"


def _name(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def accepted_keywords(cls: type, kwargs: dict[str, Any]) -> tuple[set[str], list[str]] | None:
    """The keyword names ``cls(**kwargs)`` accepts, following its ``**kwargs`` where they go,
    and the classes they were followed to; None where that cannot be told."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:  # object.__init__ takes none
        init = vars(klass).get("__init__")
        if init is None:
            continue
        try:
            params = list(inspect.signature(init).parameters.values())[1:]  # without self
        except (TypeError, ValueError):
            return None
        names |= {p.name for p in params if p.kind in _NAMED}
        rest = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
        if rest is None:
            return names, []
        try:
            target = _passed_to(cls, klass, rest, kwargs)
        except (ImportError, AttributeError, ValueError):
            return None  # a worker or job class that does not import: the class will say
        if target is not None:
            further = accepted_keywords(target, kwargs)
            return None if further is None else (names | further[0],
                                                 [_name(target), *further[1]])
    return None  # **kwargs left over: where they go is the class's own business


def _passed_to(cls: type, klass: type, rest: str, kwargs: dict[str, Any]) -> type | None:
    """Where ``klass.__init__`` passes its ``**rest``, if not to the next ``__init__``."""
    if _name(klass) == "distributed.deploy.local.LocalCluster" and rest == "worker_kwargs":
        from distributed import Nanny, Worker

        worker_class = kwargs.get("worker_class")
        if worker_class is not None:
            return worker_class if isinstance(worker_class, type) else _import(worker_class)
        return Worker if kwargs.get("processes") is False else Nanny
    if rest == "job_kwargs":  # dask-jobqueue's clusters: to their job class
        job_cls = kwargs.get("job_cls") or getattr(cls, "job_cls", None)
        return _import(job_cls) if isinstance(job_cls, str) else job_cls
    dotted = _PASSED_TO.get((_name(klass), rest))
    return _import(dotted) if dotted else None
