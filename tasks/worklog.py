"""Lost work, measured: how much training each trial had to redo because an attempt died.

While a trial trains, its attempt keeps one fixed-width line up to date in
``<run_dir>/worklog/<cell>/trial-<n>.live``: the latest update it finished and its training
seconds so far (``TrainState.time_elapsed``, the sum of update times). The line is rewritten in
place with ``os.pwrite`` and no fsync: the page cache keeps the writes of a SIGKILLed process
(a machine crash can lose the last ones).

The next attempt of that trial resumes from a checkpoint at update ``u_c`` with ``t_c`` seconds
of training; the dead attempt had got to ``u_d`` and ``t_d``. It lost ``u_d − u_c`` updates and
``t_d − t_c`` seconds of training, which this attempt redoes. Each attempt appends one JSON line
to ``trial-<n>.attempts``; :func:`summary` adds them up per trial. An attempt that stopped
*interrupted* checkpointed on its way out and lost nothing.

The figure is what the driver saw: every update in ``centralized`` mode; in ``decentralized``
mode the ranks report at the end of each segment (at most ``FLUSH_SECONDS``, 1 s), so up to a
segment of lost work can go unseen. A checkpoint is taken at the first update boundary after
``checkpoint_seconds`` of wall time, so one interval loses at most ``checkpoint_seconds`` of
training plus the update under way; with ``checkpoint_every`` (updates) it loses at most that
many updates.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from damptune.records import Record, ResumeRecord, UpdateRecord

__all__ = ["WorkLog", "summary"]

_LINE = "{update:>14d} {elapsed:>20.6f}\n"  # fixed width: an in-place rewrite never leaves a tail


class WorkLog:
    """The work record of one trial across its attempts (see the module docstring)."""

    def __init__(self, run_dir: str, cell_key: str, number: int) -> None:
        base = os.path.join(run_dir, "worklog", cell_key)
        self.live_path = os.path.join(base, f"trial-{number}.live")
        self.attempts_path = os.path.join(base, f"trial-{number}.attempts")
        self._fd: int | None = None
        self._dead: tuple[int, float] | None = None
        self.attempt: dict[str, Any] | None = None  # set when this attempt's start is known

    def __enter__(self) -> WorkLog:
        os.makedirs(os.path.dirname(self.live_path), exist_ok=True)
        self._fd = os.open(self.live_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._dead = _parse(os.pread(self._fd, 64, 0))
        self.attempt = None  # each ``with`` is one attempt
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def record(self, record: Record) -> dict[str, Any] | None:
        """Feed a training record; returns this attempt's entry when it is first known."""
        if not isinstance(record, ResumeRecord | UpdateRecord):
            return None
        started = None
        if self.attempt is None:  # a resume record comes first; without one it starts from 0
            at = ((record.update, record.time_elapsed) if isinstance(record, ResumeRecord)
                  else (0, 0.0))
            started = self._begin(*at)
        if isinstance(record, UpdateRecord):
            self._write(record.update, record.time_elapsed)
        return started

    def _begin(self, update: int, elapsed: float) -> dict[str, Any]:
        previous = _read_attempts(self.attempts_path)
        dead = self._dead
        self.attempt = {
            "attempt": len(previous) + 1, "resumed_at": update, "pid": os.getpid(),
            "started": time.time(),
            "lost_updates": max(0, dead[0] - update) if dead else 0,
            "lost_seconds": max(0.0, dead[1] - elapsed) if dead else 0.0,
        }
        with open(self.attempts_path, "a") as f:
            f.write(json.dumps(self.attempt) + "\n")
        self._write(update, elapsed)  # a death before the first update loses nothing more
        return self.attempt

    def totals(self) -> dict[str, Any]:
        """This trial's attempts so far and the work they lost (see :func:`summary`)."""
        return _totals(_read_attempts(self.attempts_path))

    def _write(self, update: int, elapsed: float) -> None:
        assert self._fd is not None, "use WorkLog as a context manager"
        os.pwrite(self._fd, _LINE.format(update=update, elapsed=elapsed).encode(), 0)


def _parse(raw: bytes) -> tuple[int, float] | None:
    try:
        update, elapsed = raw.decode().split()
        return int(update), float(elapsed)
    except ValueError:
        return None


def _read_attempts(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def summary(run_dir: str) -> dict[tuple[str, int], dict[str, Any]]:
    """Per trial ``(cell key, number)``: attempts, total and largest lost updates and seconds."""
    root = os.path.join(run_dir, "worklog")
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".attempts"):
                continue
            cell = os.path.relpath(directory, root)
            number = int(name[len("trial-"):-len(".attempts")])
            out[(cell, number)] = _totals(_read_attempts(os.path.join(directory, name)))
    return out


def _totals(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "attempts": len(attempts),
        "lost_updates": sum(a["lost_updates"] for a in attempts),
        "lost_seconds": sum(a["lost_seconds"] for a in attempts),
        "max_lost_updates": max((a["lost_updates"] for a in attempts), default=0),
        "max_lost_seconds": max((a["lost_seconds"] for a in attempts), default=0.0),
    }
