"""What a change of P costs a distributed run, in units of one update.

Runs the CNN trial of issue 11 (``damptune train --model cnn --dataset mnist1d --damper geodamp
--initial 32 --param factor=2 --param delay=1 --epochs 6 --workers 16 --per-worker-batch 32``;
ranks 1 → 16, four changes of P) in both data-parallel modes on one 16-worker LocalCluster:
first cold (every worker imports torch on its first task), then warm (as in the pipeline, whose
cluster lives for the whole grid). The cost of a change of P is measured on the ranks
(``bench/resizes.py``). Goal: ≤ 2 updates.

Run: ``python bench/resize_cost.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import resizes  # noqa: E402

TRIAL = ["train", "--model", "cnn", "--dataset", "mnist1d", "--damper", "geodamp", "--initial",
         "32", "--param", "factor=2", "--param", "delay=1", "--epochs", "6", "--workers", "16",
         "--per-worker-batch", "32"]
GOAL = 2.0  # updates per change of P


def fit(mode: str, address: str) -> tuple[list[dict], float]:
    """The trial's history and its whole-run seconds."""
    import models
    from damptune.cli import _classifier, build_parser

    args = build_parser().parse_args([*TRIAL, "--mode", mode, "--scheduler", address])
    data = models.load_dataset(args.dataset, seed=args.seed)
    clf = _classifier(args, lambda record: None)
    t0 = time.perf_counter()
    clf.fit(data.X_train, data.y_train, eval_set=(data.X_test, data.y_test))
    return clf.history_, time.perf_counter() - t0


def main() -> int:
    from distributed import Client

    from damptune.cluster import local_cluster

    cluster = local_cluster(n_workers=16, local_directory=os.path.join("runs", "dask-bench"))
    print("| run | mode | whole-run s | updates | median update | changes of P | "
          "one change of P, in updates (median; max) | goal ≤ 2 |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        with Client(cluster.scheduler_address, timeout="10s") as client:
            for run, mode in (("cold", "decentralized"), ("warm", "decentralized"),
                              ("warm", "centralized")):
                resizes.clear(client)
                history, wall = fit(mode, cluster.scheduler_address)
                costs = resizes.change_costs(history, resizes.control_seconds(client))
                updates = [r["time_update"] for r in history if r["kind"] == "update"]
                cost = statistics.median(costs) if costs else float("nan")
                print(f"| {run} | {mode} | {wall:.2f} | {len(updates)} | "
                      f"{statistics.median(updates) * 1000:.1f} ms | {len(costs)} | "
                      f"{cost:.2f}; {max(costs, default=float('nan')):.2f} | "
                      f"{'met' if cost <= GOAL else 'not met'} |", flush=True)
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
