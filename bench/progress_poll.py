"""What does `damptune tune`'s progress bar cost: one poll of a grid's finished trials?

The bar asks the Optuna storage every 2 s how many trials of the grid have finished
(``tasks.search.finished_in_grid``: one SQL count). The baseline, measured in the same run on
the same storage, is the count through Optuna's API, as the bar did before: every study (with
its attributes), then every finished trial of the grid's studies, with its reports. Both run
``--repeats`` times on a snapshot of the grid's ``optuna.db`` (taken with SQLite's backup API,
so a grid may be running), and must agree.

Goal: a poll costs at most 1 % of one core at the bar's period, i.e. <= 20 ms.

Run: ``python bench/progress_poll.py --run-dir runs/grid [--grid-name grid] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

PERIOD_S = 2.0  # flows/cli.py's _progress
GOAL_MS = 0.01 * PERIOD_S * 1000


def through_the_api(url: str, grid_name: str) -> int:
    """The old count: Optuna's API, every study, every finished trial."""
    from tasks.search import FINISHED, storage_for

    store = storage_for(url)
    return sum(len(store.get_all_trials(s._study_id, deepcopy=False, states=FINISHED))
               for s in store.get_all_studies() if s.user_attrs.get("grid") == grid_name)


def timed(fn: Callable[[str, str], int], url: str, grid: str,
          repeats: int) -> tuple[int, list[float]]:
    """(the count, the CPU milliseconds of each call), after one warm-up call."""
    count = fn(url, grid)
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn(url, grid)
        times.append((time.process_time() - t0) * 1000)
    return count, times


def spread(times: list[float]) -> str:
    return (f"{statistics.median(times):.1f} ms (min {min(times):.1f}, "
            f"max {max(times):.1f})")


def main(argv: list[str] | None = None) -> int:
    from tasks.search import finished_in_grid

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a grid's run directory (optuna.db)")
    parser.add_argument("--grid-name", default=None, help="default: the run directory's name")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    grid = args.grid_name or os.path.basename(os.path.normpath(args.run_dir))
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = os.path.join(tmp, "optuna.db")
        with sqlite3.connect(os.path.join(args.run_dir, "optuna.db")) as src, \
                sqlite3.connect(snapshot) as dst:
            src.backup(dst)
        url = f"sqlite:///{snapshot}"
        old_n, old = timed(through_the_api, url, grid, args.repeats)
        new_n, new = timed(finished_in_grid, url, grid, args.repeats)
    old_ms, new_ms = statistics.median(old), statistics.median(new)
    if old_n != new_n:
        print(f"the counts differ: {old_n} through the API, {new_n} by finished_in_grid")
        return 1
    print(f"grid {grid!r}: {new_n} finished trials; CPU per poll, median of {args.repeats}: "
          f"Optuna's API {spread(old)}, finished_in_grid {spread(new)}; "
          f"{old_ms / max(new_ms, 1e-9):.0f}x less")
    print(f"goal <= {GOAL_MS:.0f} ms per poll (1 % of one core every {PERIOD_S:g} s): "
          f"{'met' if new_ms <= GOAL_MS else 'not met'}")
    records.write("progress_poll", goals={f"<= {GOAL_MS:g} ms of CPU per poll": new_ms <= GOAL_MS},
                  figures={"poll_ms": new_ms, "optuna_api_ms": old_ms, "finished_trials": new_n},
                  repeats=args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
