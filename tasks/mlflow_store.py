"""A new SQLite MLflow store starts as a copy of an empty store of the same MLflow version.

MLflow builds the schema of a new SQLite file by replaying every one of its migrations
(alembic): about 3 s of CPU on a 2-core machine, paid by every grid with a run directory of its
own (and by each test that runs one). The first new store of an MLflow version is built that way
into ``<cache>/mlflow-store-<version>.db`` (the datasets' cache, ``$DAMPTUNE_CACHE`` or
``~/.cache/damptune``): its tables only, no experiment, so that MLflow still creates the
Default experiment with this store's own artifact root. Every later new store is a file copy
of it. A store that exists is never touched, and where the copy cannot be made, MLflow builds
the store itself as before. :func:`open_sqlite_store`, what a client and the stack's server
call, then puts the store in WAL mode (:mod:`tasks.sqlite`).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from pathlib import Path

from tasks.sqlite import sqlite_file, use_wal

__all__ = ["open_sqlite_store", "prepare_sqlite_store", "template_path"]

_log = logging.getLogger("damptune.tasks")
_BUILDING = threading.Lock()  # alembic's migrations are not safe from two threads at once


def open_sqlite_store(tracking_uri: str) -> None:
    """Ready the SQLite store of ``tracking_uri`` for a client or a server: a new one is a copy
    of the empty store (:func:`prepare_sqlite_store`), and the store is in WAL mode
    (:mod:`tasks.sqlite`). Any other URI is left alone."""
    prepare_sqlite_store(tracking_uri)  # before WAL mode, which would create the file
    use_wal(tracking_uri)


def prepare_sqlite_store(tracking_uri: str) -> bool:
    """Copy the empty store to the file of a ``sqlite://`` ``tracking_uri`` that does not exist
    yet. Returns whether this call made it; any other URI, or a file that exists (or that
    another thread or process made first), is left alone."""
    path = sqlite_file(tracking_uri)
    if path is None or path.exists():
        return False
    try:
        template = _template()
        path.parent.mkdir(parents=True, exist_ok=True)
        return _copy_new(template, path)
    except Exception as exc:  # noqa: BLE001 - MLflow then builds the store itself
        _log.debug("MLflow store %s built by MLflow (no copy: %r)", path, exc)
        return False


def template_path() -> Path:
    """Where the empty store of the installed MLflow version is kept."""
    import mlflow

    from models.datasets import default_cache_dir

    return default_cache_dir() / f"mlflow-store-{mlflow.__version__}.db"


def _template() -> Path:
    """The empty store, built once per MLflow version (atomically: a reader never sees half)."""
    path = template_path()
    with _BUILDING:
        if path.exists():
            return path
        import sqlalchemy
        from mlflow.store.db.utils import _initialize_tables  # MLflow's own schema build

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _beside(path)
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(tmp, path)  # another process's, built the same way, may replace it: equal
    return path


def _copy_new(template: Path, path: Path) -> bool:
    """Copy ``template`` to ``path`` unless something created ``path`` meanwhile (another
    process opening the same store): the copy appears whole, under its name, or not at all.
    Returns whether this call made it."""
    tmp = _beside(path)
    try:
        shutil.copyfile(template, tmp)
        os.link(tmp, path)  # fails if ``path`` exists: never over a store being written
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _beside(path: Path) -> Path:
    """A temporary name next to ``path`` (the same file system: a rename or link is atomic)."""
    return path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:8]}")
