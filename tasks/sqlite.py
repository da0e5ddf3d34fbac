"""The pipeline's SQLite databases (Optuna's studies, MLflow's store) in write-ahead-log mode.

SQLite's default rollback journal makes every commit create, sync and delete a journal file,
and a reader's lock blocks every writer: the grid's cells and trials write one study database
from many threads, while ``damptune report``, the Optuna dashboard or a second run read it. In
WAL mode a commit appends to one log (synced once: ``synchronous`` stays at SQLite's default,
FULL, so a committed trial survives a crash of the machine as before), and readers and the
writer no longer wait for each other. The mode is a property of the database file: set once,
every later connection (another process's, a server's) uses it.

WAL needs the database on a local file system (its readers share memory through a ``-shm``
file beside it), as SQLite's locking always did. A database that cannot be switched (read
only, or locked past the timeout) keeps its mode; nothing else changes.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

__all__ = ["sqlite_file", "use_wal"]

_log = logging.getLogger("damptune.tasks")


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite://`` SQLAlchemy URL (absolute); None for any other URL, an
    in-memory database or a ``file:`` URI."""
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser().absolute()


def use_wal(url: str, *, timeout: float = 60.0) -> bool:
    """Put the SQLite database of ``url`` in WAL mode (creating the file, and its directory, if
    they do not exist). Returns whether it is in WAL mode now; False for a URL that is not a
    SQLite file, or a database that could not be switched (it is then used as it is)."""
    path = sqlite_file(url)
    if path is None:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=timeout)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        _log.debug("SQLite database %s keeps its journal mode: %r", path, exc)
        return False
    return str(mode).lower() == "wal"
