"""What does a new grid's MLflow store cost before its first run: MLflow's migrations or a
copy?

Each grid with a run directory of its own opens a new SQLite MLflow store
(``<run_dir>/mlflow.db``), and so does each test that runs a grid. MLflow builds its schema
by replaying every migration (alembic); ``tasks.mlflow_store`` copies an empty store of the
same MLflow version instead (built once). Both are timed here in the same process, alternated,
``--repeats`` times each: the wall and CPU time from nothing to a client that has listed the
store's experiments. The template itself is built before the first copy and not counted (a
machine builds it once per MLflow version).

Goal: the copy costs at most a tenth of the migrations (CPU).

Run: ``python bench/mlflow_store.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

GOAL = 0.1


def open_store(path: str, *, copy: bool) -> tuple[float, float]:
    """(wall s, CPU s) from no file to a client that listed the experiments."""
    from mlflow.tracking import MlflowClient

    from tasks.mlflow_store import prepare_sqlite_store

    uri = f"sqlite:///{path}"
    wall, cpu = time.perf_counter(), time.process_time()
    if copy:
        assert prepare_sqlite_store(uri), "no copy was made"
    MlflowClient(uri).search_experiments()
    return time.perf_counter() - wall, time.process_time() - cpu


def spread(values: list[float]) -> str:
    low_mid_high = (min(values), statistics.median(values), max(values))
    return f"{' / '.join(f'{v:.3f}' for v in low_mid_high)} s (min / median / max)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DAMPTUNE_CACHE"] = os.path.join(tmp, "cache")  # a template of this run's
        open_store(os.path.join(tmp, "warm.db"), copy=True)  # imports, and the template
        open_store(os.path.join(tmp, "warm-own.db"), copy=False)  # alembic's imports
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for i in range(args.repeats):
            for copy in (False, True):
                runs[copy].append(open_store(os.path.join(tmp, f"{copy}-{i}.db"), copy=copy))
    return report(runs)


def report(runs: dict[bool, list[tuple[float, float]]]) -> int:
    for name, copy in (("MLflow's migrations", False), ("copy of the empty store", True)):
        rows = runs[copy]
        print(f"{name}: wall {spread([w for w, _ in rows])}; "
              f"CPU {spread([c for _, c in rows])}")
    ratio = (statistics.median(c for _, c in runs[True])
             / statistics.median(c for _, c in runs[False]))
    met = ratio <= GOAL
    print(f"CPU, copy / migrations (medians): {ratio:.3f} (goal <= {GOAL}): "
          f"{'met' if met else 'not met'}")
    figures = {"copy_over_migrations_cpu": ratio}
    for name, copy in (("migrations", False), ("copy", True)):
        figures[f"{name}_cpu_s"] = statistics.median(c for _, c in runs[copy])
        figures[f"{name}_wall_s"] = statistics.median(w for w, _ in runs[copy])
    records.write("mlflow_store", figures=figures, repeats=len(runs[True]),
                  goals={f"copy <= {GOAL:g} of the migrations' CPU": met})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
