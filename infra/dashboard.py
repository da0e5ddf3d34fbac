"""Optuna's dashboard on a grid's storage, bound to 127.0.0.1: what ``make dashboard`` runs.

::

    python -m infra.dashboard [--storage sqlite:///runs/grid/optuna.db] [--port 8080]

First it marks ``damptune_state=interrupted`` the trials a dead run left RUNNING (SIGKILLed, a
lost machine: :func:`tasks.driver.mark_stale`), so that the dashboard does not show them as
training; then it replaces itself (same PID) by ``optuna-dashboard`` (the ``dashboard`` extra).
Stop it with Ctrl-C, or SIGTERM to that PID.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from infra.stack import HOST

__all__ = ["main", "command"]

DEFAULT_STORAGE = "sqlite:///runs/grid/optuna.db"
DEFAULT_PORT = 8080


def command(storage: str, port: int) -> list[str]:
    """The optuna-dashboard command line on ``storage`` at ``HOST:port``."""
    exe = shutil.which("optuna-dashboard", path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if exe is None:
        raise SystemExit("optuna-dashboard is not installed in this environment: "
                         "`make dashboard` installs it, or pip install -e '.[dashboard]'")
    return [exe, storage, "--host", HOST, "--port", str(port)]


def _check_sqlite(storage: str) -> None:
    """A SQLite storage that does not exist would be created empty: say so instead."""
    prefix = "sqlite:///"
    if storage.startswith(prefix) and not Path(storage[len(prefix):]).is_file():
        raise SystemExit(f"no Optuna storage at {storage[len(prefix):]}: run the grid first "
                         "(`make run`, or `make smoke` and then `make dashboard GRID=smoke`), "
                         "or pass --storage URL")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.dashboard",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--storage", default=DEFAULT_STORAGE,
                        help=f"the grid's Optuna storage URL (default {DEFAULT_STORAGE})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port on {HOST} (default {DEFAULT_PORT})")
    args = parser.parse_args(argv)
    _check_sqlite(args.storage)
    argv_out = command(args.storage, args.port)
    from tasks.driver import mark_stale

    marked = mark_stale(args.storage, owner=f"dashboard-{os.getpid()}")
    for study, number in marked:
        print(f"{study}: trial {number} was left RUNNING by a dead run: marked "
              "damptune_state=interrupted (a rerun of the grid continues it)", flush=True)
    print(f"Optuna dashboard: http://{HOST}:{args.port}/dashboard", flush=True)
    os.execv(argv_out[0], argv_out)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
