"""``make run``'s live progress: the grid's cells and trials, read from its Optuna storage.

While the flow run works, :class:`GridWatch` looks at the grid's storage every few seconds
(:func:`tasks.progress.finished_per_cell`) and shows, in place, cells done of all, trials done,
the held-out stage, the time elapsed and rich's estimate of the time left. Where the output is
not a terminal (a log file, CI) it prints the same as a plain line whenever the counts change,
at most once a minute.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tasks.grid import Cell
from tasks.progress import GridProgress, finished_per_cell
from tasks.sqlite import sqlite_file

__all__ = ["GridWatch", "expected_cells"]

LOOK_S = 3.0  # seconds between two looks at the storage
PLAIN_EVERY_S = 60.0  # at most one plain line a minute where the output is no terminal


def expected_cells(params: dict[str, Any], root: Path) -> tuple[str, str, list[tuple[Cell, int]]]:
    """The flow run's grid: (its Optuna storage URL, grid name, each stage's cells with the
    trials each is to finish), from the run's parameters, a relative ``run_dir`` taken under
    ``root`` (the deployment's working directory)."""
    from flows.tune import grid_of, stages
    from tasks.validation import expected_trials

    run_dir = params.get("run_dir") or f"runs/{params.get('grid_name') or 'grid'}"
    settings, cells = grid_of({**params, "run_dir": str(root / run_dir)})
    expected = [(c, expected_trials(settings, c, cells)) for c in stages(settings, cells)]
    return settings.storage, settings.grid_name, expected


class GridWatch:
    """A thread that shows the grid's progress until :meth:`stop`; a context manager."""

    def __init__(self, storage: str, grid_name: str, expected: list[tuple[Cell, int]], *,
                 console: Console | None = None, clock: Callable[[], float] = time.monotonic):
        self.storage, self.grid_name, self.expected = storage, grid_name, expected
        self.console = console or Console(stderr=True)
        self.clock = clock
        self.last: GridProgress | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grid-progress", daemon=True)

    def __enter__(self) -> GridWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def look(self) -> GridProgress | None:
        """The grid's progress now; None while its storage does not exist yet."""
        if not _made(self.storage):
            return self.last  # the flow makes it: never made here, nor its tables
        try:
            finished = finished_per_cell(self.storage, self.grid_name)
        except Exception:  # noqa: BLE001 - a storage being created or locked: next look
            return self.last
        self.last = GridProgress.of(self.expected, finished)
        return self.last

    def _run(self) -> None:
        if self.console.is_terminal:
            self._live()
        else:
            self._plain()

    def _live(self) -> None:
        columns = (TextColumn("[bold]{task.description}"), BarColumn(),
                   MofNCompleteColumn(), TextColumn("trials · {task.fields[cells]}"),
                   TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=False) as bar:
            task = bar.add_task(f"grid {self.grid_name}", cells="waiting for the first trial",
                                total=sum(n for _, n in self.expected))
            while not self._stop.wait(LOOK_S):
                p = self.look()
                if p is not None:
                    bar.update(task, completed=p.trials_done, cells=_cells_text(p))

    def _plain(self) -> None:
        t0, shown, said_at = self.clock(), None, -PLAIN_EVERY_S
        while not self._stop.wait(LOOK_S):
            p = self.look()
            now = self.clock()
            if p is None or p == shown or now - said_at < PLAIN_EVERY_S:
                continue
            shown, said_at = p, now
            self.console.print(f"grid {self.grid_name}: {p.line()} · "
                               f"{_clock(now - t0)} elapsed{_left(p, now - t0)}",
                               highlight=False, soft_wrap=True)  # one line in a log


def _made(storage: str) -> bool:
    """Whether the flow has made its Optuna storage: any URL but a SQLite file; a SQLite
    file once it holds Optuna's tables (its ``alembic_version`` row, written last), read
    through a read-only connection. Opened through Optuna while the flow was making it (the
    file exists, its tables not yet), the look made the tables too, and the flow's own
    making failed ("table studies already exists")."""
    path = sqlite_file(storage)
    if path is None:
        return True
    if not path.is_file():
        return False
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            return bool(conn.execute("SELECT COUNT(*) FROM alembic_version").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:  # no such table yet, or locked: the next look
        return False


def _cells_text(p: GridProgress) -> str:
    held_out = (f" · held-out cells {p.held_out_done}/{p.held_out_cells}"
                if p.held_out_cells else "")
    return f"cells {p.cells_done}/{p.cells}{held_out}"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def _left(p: GridProgress, elapsed: float) -> str:
    """`` · about M:SS left`` at the pace so far (nothing before the first trial)."""
    if not p.trials_done:
        return ""
    return f" · about {_clock(elapsed * (p.trials - p.trials_done) / p.trials_done)} left"
