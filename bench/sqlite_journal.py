"""What WAL mode changes for the grid's Optuna database (tasks.sqlite): its writes' cost, and a
reader's effect on them.

Each round makes two fresh study databases in the run directory's file system: one in SQLite's
default rollback journal (``delete``), one as the grid opens it (``storage_for``: WAL), and
writes ``--trials`` trials to each as a search trial does (ask, ``--reports`` intermediate
values, a user attribute, tell), alternating which goes first. Then, on each database, a reader
holds a read transaction open (as ``damptune report`` or the Optuna dashboard mid-query) while
trials are written with a busy timeout of 0.2 s: those that had a write fail.

    python bench/sqlite_journal.py [--trials 40] [--reports 10] [--rounds 3] [--dir DIR]

It prints the median (min-max) wall and CPU milliseconds per trial of each mode, their ratio,
the trials a reader made fail, and the disk's sync time (an ``fsync``'s milliseconds). No goal:
it says what the mode buys on this machine's disk.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402

from tasks.search import engine_kwargs_for, storage_for  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _storage(path: Path, mode: str) -> optuna.storages.BaseStorage:
    """The grid's storage (``wal``), or the same but in the rollback journal (``delete``)."""
    url = f"sqlite:///{path}"
    if mode == "wal":
        return storage_for(url)
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs_for(url))


def _write_trials(study: optuna.Study, trials: int, reports: int) -> int:
    """Trials as a search writes them; returns how many had a write fail (a locked
    database: the ask, after Optuna's own retries of about 5 s, or any later write)."""
    failed = 0
    for i in range(trials):
        try:
            trial = study.ask()
            x = trial.suggest_float("x", 0.0, 1.0)
            for step in range(reports):
                trial.report(x * step, step)
            trial.set_user_attr("i", i)
            study.tell(trial, x)
        except optuna.exceptions.StorageInternalError:
            failed += 1
    return failed


def _timed(path: Path, mode: str, args: argparse.Namespace) -> tuple[float, float]:
    study = optuna.create_study(study_name="b", storage=_storage(path, mode))
    wall, cpu = time.perf_counter(), time.process_time()
    _write_trials(study, args.trials, args.reports)
    return ((time.perf_counter() - wall) * 1e3 / args.trials,
            (time.process_time() - cpu) * 1e3 / args.trials)


BLOCKED_TRIALS = 2  # trials written while a reader holds its transaction open


def _blocked(path: Path, mode: str, args: argparse.Namespace) -> int:
    """Of :data:`BLOCKED_TRIALS` trials written while a reader holds a read transaction open
    (busy timeout 0.2 s), those that had a write fail."""
    before = os.environ.get("DAMPTUNE_SQLITE_TIMEOUT")
    os.environ["DAMPTUNE_SQLITE_TIMEOUT"] = "0.2"
    try:
        study = optuna.create_study(study_name="r", storage=_storage(path, mode))
        study.ask()  # a row for the reader to read
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("select count(*) from trials").fetchone()
        try:
            return _write_trials(study, BLOCKED_TRIALS, args.reports)
        finally:
            reader.execute("COMMIT")
            reader.close()
    finally:  # the caller's setting back
        if before is None:
            del os.environ["DAMPTUNE_SQLITE_TIMEOUT"]
        else:
            os.environ["DAMPTUNE_SQLITE_TIMEOUT"] = before


def _fsync_ms(directory: str, n: int = 30) -> list[float]:
    """Milliseconds of ``n`` syncs of a 4 KiB write each, in ``directory``: the disk's sync."""
    times = []
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        for _ in range(n):
            f.write(b"x" * 4096)
            f.flush()
            start = time.perf_counter()
            os.fsync(f.fileno())
            times.append((time.perf_counter() - start) * 1e3)
    return times


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--reports", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="runs", help="where the databases go (then removed)")
    args = parser.parse_args(argv)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    walls: dict[str, list[float]] = {"delete": [], "wal": []}
    cpus: dict[str, list[float]] = {"delete": [], "wal": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.rounds):
            for mode in (("delete", "wal") if r % 2 == 0 else ("wal", "delete")):
                wall, cpu = _timed(Path(tmp) / f"{mode}{r}.db", mode, args)
                walls[mode].append(wall)
                cpus[mode].append(cpu)
        blocked = {mode: _blocked(Path(tmp) / f"read-{mode}.db", mode, args)
                   for mode in ("delete", "wal")}
    print(f"{args.trials} trials x ({args.reports} reports + ask, attribute, tell), "
          f"{args.rounds} rounds; ms per trial, median (min-max)")
    for mode in ("delete", "wal"):
        print(f"  {mode:6s}  wall {_spread(walls[mode])}  cpu {_spread(cpus[mode])}  "
              f"trials a reader made fail: {blocked[mode]} of {BLOCKED_TRIALS}")
    sync = _fsync_ms(args.dir)
    print(f"  this disk's sync (fsync of a 4 KiB write, {len(sync)} times): {_spread(sync)} ms")
    ratio = {k: statistics.median(v["wal"]) / statistics.median(v["delete"])
             for k, v in (("wall", walls), ("cpu", cpus))}
    print(f"  wal / delete: wall {ratio['wall']:.2f}x, cpu {ratio['cpu']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
