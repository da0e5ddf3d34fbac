"""What does the pipeline (Prefect tasks + Optuna + MLflow) add per trial to the engine alone?

Baseline: the same trials (same damper hyperparameters, as Optuna sampled them) trained by
calling ``damptune.train`` directly on the same Dask cluster, in the same run. Both use a
cluster started beforehand, so its start-up counts in neither. The flow runs under a temporary
Prefect server (started before the clock starts).

The per-trial overhead is the slope between a grid of ``--small`` and one of ``--trials``
trials (pipeline minus engine), so the flow's fixed cost (flow run, cluster connection, summary
and artifacts) is reported apart. Run: ``python bench/pipeline_overhead.py``.

Goal: <= 0.2 s per trial.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="the larger grid")
    parser.add_argument("--small", type=int, default=4, help="the smaller grid")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--network", type=int, default=2)
    args = parser.parse_args(argv)

    import optuna
    from prefect.testing.utilities import prefect_test_harness

    from damptune import TrainData, train
    from damptune.cluster import local_cluster
    from flows.tune import tune
    from models import load_dataset
    from tasks.grid import Cell, GridSettings
    from tasks.trial import trial_config

    tmp = tempfile.mkdtemp(prefix="damptune-bench-")
    cluster = local_cluster(n_workers=args.network, local_directory=os.path.join(tmp, "dask"))
    settings = GridSettings(epochs=args.epochs, target_accuracy=1.0)
    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    cell = Cell(args.network, "geodamp", "mlp")
    sizes = (args.small, args.trials)

    def pipeline(n: int) -> tuple[float, list[dict]]:
        name = f"bench{n}"
        t0 = time.perf_counter()
        tune(grid_name=name, run_dir=os.path.join(tmp, name), networks=[args.network],
             algorithms=["geodamp"], models=["mlp"], epochs=args.epochs, target_accuracy=1.0,
             pruner="none", trials=n, cluster=cluster.scheduler_address,
             max_concurrent_cells=1)
        wall = time.perf_counter() - t0
        study = optuna.load_study(study_name=f"{name}/n{args.network}/geodamp/mlp",
                                  storage=f"sqlite:///{tmp}/{name}/optuna.db")
        return wall, [dict(t.params) for t in study.trials]

    def direct(params: list[dict]) -> float:
        t0 = time.perf_counter()
        for p in params:
            train(trial_config(settings, cell, p, ds), data, cluster=cluster.scheduler_address)
        return time.perf_counter() - t0

    try:
        with prefect_test_harness(server_startup_timeout=120):
            pipeline(1)  # warm-up: imports, data cache, calibration, the workers' first model
            walls = {n: pipeline(n) for n in sizes}
        directs = {n: direct(walls[n][1]) for n in sizes}
    finally:
        cluster.close()

    (n1, n2) = sizes
    pipe_slope = (walls[n2][0] - walls[n1][0]) / (n2 - n1)
    direct_slope = (directs[n2] - directs[n1]) / (n2 - n1)
    per_trial = pipe_slope - direct_slope
    fixed = walls[n1][0] - directs[n1] - per_trial * n1
    print(f"MLP on MNIST-1D, {args.network} ranks, {args.epochs:g} epoch(s) per trial; "
          f"same hyperparameters both ways; {os.cpu_count()} cores")
    print("| run | trials | pipeline s | engine alone s (baseline) | ratio |")
    print("|---|---|---|---|---|")
    for n in sizes:
        print(f"| grid of one cell | {n} | {walls[n][0]:.2f} | {directs[n]:.2f} | "
              f"{walls[n][0] / directs[n]:.2f}x |")
    print(f"\nper trial (slope between {n1} and {n2} trials): pipeline {pipe_slope:.3f} s, "
          f"engine {direct_slope:.3f} s -> overhead {per_trial:.3f} s per trial "
          f"(goal <= 0.2 s: {'met' if per_trial <= 0.2 else 'not met'})")
    print(f"fixed overhead per flow run (start, cluster connection, summary, artifacts): "
          f"{fixed:.2f} s")
    records.write("pipeline_overhead", goals={"<= 0.2 s per trial": per_trial <= 0.2},
                  figures={"overhead_per_trial_s": per_trial, "pipeline_per_trial_s": pipe_slope,
                           "engine_per_trial_s": direct_slope, "fixed_per_flow_run_s": fixed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
