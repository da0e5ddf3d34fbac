"""The grid's stores, checked before any work: its run directory can be written, its SQLite
files (Optuna's storage, MLflow's store) are sound databases, and MLflow answers.

A store that fails is a :class:`StoreFault`: a fault of the disk, the file or the server, not
of the input (``damptune tune`` exits 1, not 2). Each check only reads, or writes and deletes a
probe file of its own, so a refused run leaves every file of an earlier grid as it was.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from damptune import DamptuneError
from tasks.grid import GridSettings
from tasks.sqlite import sqlite_file

__all__ = ["StoreFault", "check_stores", "check_writable", "check_sqlite", "check_meta",
           "os_fault", "META"]

META = "grid.json"  # the run directory's metadata: which grid it belongs to

PROBE_BYTES = 4096  # one page: a full disk refuses it, an empty inode alone does not tell

# what a rerun does without the store, by parameter (the advice of a corrupt file)
_WITHOUT = {
    "storage": "the grid's searches then start anew: the trials it held are not recovered",
    "tracking_uri": "a new store is then made: the runs it held are not recovered, the "
                    "trials in Optuna are kept",
}


class StoreFault(DamptuneError):
    """A store of the grid (its run directory, Optuna's storage, MLflow's) cannot be written,
    read or reached: a fault of the disk, the file or the server, not of the input. The
    message names the path or URI, the cause, what was kept and what to do."""

    exit_code = 1  # ``damptune tune``: read the message, fix, then rerun


def check_stores(settings: GridSettings) -> None:
    """Every store of the grid, before anything is written: the run directory (and the
    directories of its SQLite files and of a local ``checkpoint_root``) can be written, its
    ``grid.json`` and the SQLite files that exist are sound, and an MLflow server answers."""
    from tasks import tracking  # it imports this module (StoreFault)

    for directory, param in _directories(settings):
        check_writable(directory, param=param, run_dir=settings.run_dir)
    check_meta(settings.run_dir, settings.grid_name)
    check_sqlite(settings.storage, param="storage", what="Optuna's storage")
    check_sqlite(settings.tracking_uri, param="tracking_uri", what="MLflow's store")
    tracking.check_reachable(settings.tracking_uri)


def _directories(settings: GridSettings) -> list[tuple[str, str]]:
    """(directory, parameter) of every local directory the grid writes, each once."""
    found = {settings.run_dir: "run_dir"}
    for param in ("storage", "tracking_uri"):
        path = sqlite_file(getattr(settings, param))
        if path is not None:
            found.setdefault(str(path.parent), param)
    root = settings.checkpoint_root
    if root and urlparse(root).scheme in ("", "file"):
        found.setdefault(root.removeprefix("file://"), "checkpoint_root")
    return [(d, p) for d, p in found.items() if d]


def check_writable(directory: str, *, param: str = "run_dir", run_dir: str = "") -> None:
    """A probe file written (one page, synced) and deleted in ``directory``, or in its nearest
    existing parent when it does not exist yet (nothing is created); a :class:`StoreFault`
    naming the directory and the cause when that fails."""
    target = Path(directory).absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    if not target.is_dir():  # a file in the way: the run's own error names it
        return
    try:
        fd, probe = tempfile.mkstemp(prefix=".damptune-probe-", dir=target)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise os_fault(exc, f"{param}={directory!r}", run_dir=run_dir or directory) from None


def os_fault(exc: OSError, where: str, *, run_dir: str, doing: str = "written") -> StoreFault:
    """The :class:`StoreFault` of an OSError met when ``where`` was ``doing`` (written, read):
    its cause in words and by name (no space left, read-only file system, permission denied),
    what was kept (the files of ``run_dir``) and what to do."""
    name = errno.errorcode.get(exc.errno or 0, "")
    cause = f"{exc.strerror or exc} ({name})" if name else str(exc)
    kept = _kept(run_dir)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFault(f"{where} cannot be {doing}: {cause}. The disk is full: a fault of "
                          f"the storage, not of the input. Nothing was run; {kept}. Free "
                          "space there and run the grid again: it continues.")
    return StoreFault(f"{where} cannot be {doing}: {cause}, a fault of the storage, not of "
                      f"the input. Nothing was run; {kept}. Make it "
                      f"{'readable' if doing == 'read' else 'writable'} (or give the grid "
                      "another run_dir) and run the grid again.")


def _kept(run_dir: str) -> str:
    """What a refused run kept, in words: the run directory's files, by name."""
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return "nothing was changed"
    if not names:
        return "nothing was changed"
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return f"the grid's files in {run_dir} ({shown}) are kept as they were"


def check_meta(run_dir: str, grid_name: str) -> None:
    """The run directory's ``grid.json``, if there is one, reads as the JSON object damptune
    writes; else a :class:`StoreFault` naming it and the cause (left as it is)."""
    path = os.path.join(run_dir, META)
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise os_fault(exc, path, run_dir=run_dir, doing="read") from None
    except ValueError as exc:  # not JSON (UnicodeDecodeError too)
        meta = exc
    if not isinstance(meta, dict):
        cause = meta if isinstance(meta, ValueError) else f"a {type(meta).__name__}"
        raise StoreFault(f"{path} is not the JSON object damptune writes ({cause}): the file "
                         "was damaged. It was left as it is, and nothing was run. If this is "
                         f"grid {grid_name!r}'s run_dir, delete it (the run writes it again); "
                         "else give the grid its own run_dir.")


def check_sqlite(url: str, *, param: str, what: str) -> None:
    """The SQLite file of ``url``, if it exists, opens as a database and passes SQLite's
    ``quick_check``; else a :class:`StoreFault` naming the file and what is wrong, the file
    left as it is. Only reads: an existing write-ahead log is read through a read-only
    connection (a read-write one would fold it into the file when it closes)."""
    path = sqlite_file(url)
    if path is None or not path.is_file():
        return
    try:
        if not os.access(path, os.W_OK):  # not open(): closing a descriptor of the file
            # drops every SQLite lock this process holds on it (POSIX), and another process
            # closing its connection then deletes the write-ahead log this one still writes
            code = errno.EROFS if os.statvfs(path).f_flag & os.ST_RDONLY else errno.EACCES
            raise OSError(code, os.strerror(code), str(path))
        problems = _quick_check(path)
    except OSError as exc:
        raise os_fault(exc, f"{what} {path} ({param})", run_dir=str(path.parent)) from None
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return  # another run writes it: sound enough to wait for (its own timeout)
        problems = [f"{exc} ({exc.sqlite_errorname})"]
    if problems:
        raise StoreFault(
            f"{what} {path} ({param}={url!r}) is not a sound SQLite database: "
            f"{'; '.join(problems)[:500]}. It was left as it is, and nothing was run. Restore "
            f"it from a backup, or move it away ({_WITHOUT.get(param, 'it is then made anew')})"
            ", and run the grid again.")


def _quick_check(path: Path) -> list[str]:
    """SQLite's ``quick_check`` of the file: its problems, none when it is sound."""
    read_only = Path(f"{path}-wal").exists()
    target = f"{path.as_uri()}?mode=ro" if read_only else str(path)
    conn = sqlite3.connect(target, uri=read_only, timeout=5.0)
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    finally:
        conn.close()
    return [str(r[0]) for r in rows if r and r[0] != "ok"]
