"""What a change of P costs in ``decentralized`` mode, in units of one update.

Runs the CNN trial of issue 11 (``damptune train --model cnn --dataset mnist1d --damper geodamp
--initial 32 --param factor=2 --param delay=1 --epochs 6 --workers 16 --per-worker-batch 32
--mode decentralized``; ranks 1 → 16) twice on one 16-worker LocalCluster: cold (every worker
imports torch on its first task) and warm (as in the pipeline, whose cluster lives for the whole
grid). It times the runner's group formations, changes of P and teardowns, and prints the cost
of one change of P against the mean update time of the same run. Goal: ≤ 2 updates.

Run: ``python bench/resize_cost.py`` (on an older checkout it times what that code has).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRIAL = ["train", "--model", "cnn", "--dataset", "mnist1d", "--damper", "geodamp", "--initial",
         "32", "--param", "factor=2", "--param", "delay=1", "--epochs", "6", "--workers", "16",
         "--per-worker-batch", "32", "--mode", "decentralized", "--json", "--no-progress"]
GOAL = 2.0  # updates per change of P


def timed(times: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times.setdefault(name, []).append(time.perf_counter() - t0)
    return wrapper


def main() -> int:
    import contextlib
    import io

    import damptune.decentralized as dc
    from damptune.cli import main as damptune
    from damptune.cluster import local_cluster

    times: dict[str, list[float]] = {}
    for name in ("form", "resize", "teardown"):  # resize: absent before subgroups
        if hasattr(dc.DecentralizedRunner, name):
            setattr(dc.DecentralizedRunner, name,
                    timed(times, name, getattr(dc.DecentralizedRunner, name)))
    cluster = local_cluster(n_workers=16, local_directory=os.path.join("runs", "dask-bench"))
    print("| run | train s | updates | s per update | formations (s) | changes of P (s) | "
          "teardowns (s) | one change of P, in updates | goal ≤ 2 |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for run in ("cold", "warm"):
            times.clear()
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                damptune([*TRIAL, "--scheduler", cluster.scheduler_address])
            summary = json.loads(out.getvalue().strip().splitlines()[-1])
            per_update = summary["train_seconds"] / summary["updates"]
            forms, resizes = times.get("form", []), times.get("resize", [])
            # before subgroups every change of P was a teardown and a formation
            changes = resizes or forms[1:]
            cost = sum(changes) / len(changes) if changes else 0.0
            if not resizes:
                cost += sum(times.get("teardown", [])[1:]) / max(1, len(changes))
            print(f"| {run} | {summary['train_seconds']:.2f} | {summary['updates']} | "
                  f"{per_update * 1000:.1f} ms | {len(forms)} ({sum(forms):.2f}) | "
                  f"{len(changes)} ({sum(changes):.2f}) | "
                  f"{len(times.get('teardown', []))} ({sum(times.get('teardown', [])):.2f}) | "
                  f"{cost / per_update:.1f} | "
                  f"{'met' if cost / per_update <= GOAL else 'not met'} |")
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
