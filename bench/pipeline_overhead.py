"""Per-trial overhead of the pipeline (Prefect tasks + Optuna + MLflow) over the engine alone.

Baseline: the same trials (same damper hyperparameters, as Optuna sampled them) trained by
calling ``damptune.train`` directly on the same Dask cluster, in the same run. Both use a
cluster started beforehand, so its start-up counts in neither. The flow runs under a temporary
Prefect server (started before the clock starts).

Run: ``python bench/pipeline_overhead.py [--trials 8] [--epochs 1]``. Goal: <= 0.2 s per trial.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
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
    common = dict(networks=[args.network], algorithms=["geodamp"], models=["mlp"],
                  epochs=args.epochs, target_accuracy=1.0, pruner="none", trials=args.trials,
                  cluster=cluster.scheduler_address, max_concurrent_cells=1)
    try:
        with prefect_test_harness(server_startup_timeout=120):
            # warm-up: imports, the data cache, compute calibration, the workers' first model
            tune(grid_name="warm", run_dir=os.path.join(tmp, "warm"), **{**common, "trials": 1})
            t0 = time.perf_counter()
            tune(grid_name="bench", run_dir=os.path.join(tmp, "bench"), **common)
            pipeline = time.perf_counter() - t0

        study = optuna.load_study(study_name=f"bench/n{args.network}/geodamp/mlp",
                                  storage=f"sqlite:///{tmp}/bench/optuna.db")
        settings = GridSettings(epochs=args.epochs, target_accuracy=1.0)
        ds = load_dataset("mnist1d", seed=0)
        data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
        cell = Cell(args.network, "geodamp", "mlp")
        t0 = time.perf_counter()
        for trial in study.trials:
            train(trial_config(settings, cell, trial.params, ds), data,
                  cluster=cluster.scheduler_address)
        direct = time.perf_counter() - t0
    finally:
        cluster.close()

    n = len(study.trials)
    per_trial = (pipeline - direct) / n
    print(f"{n} trials of {args.epochs:g} epoch(s), MLP on MNIST-1D, {args.network} ranks")
    print("| run | total s | per trial s |")
    print("|---|---|---|")
    print(f"| engine alone (baseline) | {direct:.2f} | {direct / n:.3f} |")
    print(f"| Prefect + Optuna + MLflow | {pipeline:.2f} | {pipeline / n:.3f} |")
    print(f"| overhead | {pipeline - direct:.2f} | {per_trial:.3f} |")
    print(f"ratio pipeline/engine: {pipeline / direct:.2f}x; goal: overhead <= 0.2 s per trial "
          f"({'met' if per_trial <= 0.2 else 'not met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
