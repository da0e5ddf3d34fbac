"""Whole-trial time of the two data-parallel modes against ``local`` (same math, one process).

One fixed trial per model (issue 11's: ``damptune train --model cnn --dataset mnist1d --damper
geodamp --initial 32 --param factor=2 --param delay=1 --epochs 6 --per-worker-batch 32``, and the
same with ``--model mlp``), at P_max = 1, 4 and 16, in ``local``, ``centralized`` and
``decentralized`` mode, each also with ``--eval-flush`` (``+flush``: every evaluation ends
the ranks' segment, as before ``eval_flush``; no goal). The Dask cluster (16 single-threaded
workers) is started once and warmed by one trial first, as in the pipeline, whose cluster lives
for the whole grid. Each figure is the median of ``--repeat`` runs, all in this run.

Prints training seconds (the engine's ``time_elapsed``) and whole-trial seconds (``fit`` from
call to return: group formation, segments, teardown) as ratios to ``local``, and their
difference: the trial's cost outside its updates (the medians' difference), which varies less
with the machine's load than either. Goal: whole-trial
time ≤ 2× local at P_max = 4 and ≤ 3× at P_max = 16 (on a 2-core machine, where every rank
shares the same two cores, ``local`` is the floor).

Run: ``python bench/trial_throughput.py [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GOALS = {4: 2.0, 16: 3.0}
# the rows: a mode, and whether each evaluation ends the ranks' segment (``--eval-flush``:
# what a grid with a report-reading pruner does, and what every trial did before `eval_flush`)
MODES = ("local", "centralized", "decentralized", "centralized+flush", "decentralized+flush")


def trial(model: str, workers: int, mode: str, scheduler: str) -> list[str]:
    mode, _, flush = mode.partition("+")
    return ["train", "--model", model, "--dataset", "mnist1d", "--damper", "geodamp",
            "--initial", "32", "--param", "factor=2", "--param", "delay=1", "--epochs", "6",
            "--workers", str(workers), "--per-worker-batch", "32", "--mode", mode,
            "--scheduler", scheduler, "--json", "--no-progress",
            *(["--eval-flush"] if flush else [])]


def run_once(argv: list[str]) -> dict:
    from damptune.cli import main as damptune

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = damptune(argv)
    if code != 0:
        raise SystemExit(f"damptune {' '.join(argv)} exited {code}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def measure(model: str, workers: int, mode: str, scheduler: str, repeat: int) -> tuple[float,
                                                                                      float]:
    runs = [run_once(trial(model, workers, mode, scheduler)) for _ in range(repeat)]
    return (statistics.median(r["train_seconds"] for r in runs),
            statistics.median(r["wall_seconds"] for r in runs))


def main(argv: list[str] | None = None) -> int:
    from damptune.cluster import local_cluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--workers", default="1,4,16",
                        help="P_max values (1: a trial as the grid runs it on a machine of few "
                        "cores, one worker per trial; no goal)")
    args = parser.parse_args(argv)
    sizes = [int(w) for w in args.workers.split(",")]
    cluster = local_cluster(n_workers=max(sizes), local_directory="runs/bench-dask")
    address = cluster.scheduler_address
    print(f"{os.cpu_count()} cores; {max(sizes)} single-threaded Dask workers, warm; "
          f"median of {args.repeat} runs")
    print()
    print("| model | P_max | mode | train s | ratio | whole-trial s | ratio | outside training s "
          "| goal |")
    print("|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    try:
        run_once(trial("cnn", max(sizes), "decentralized", address))  # warm the workers
        for model in args.models.split(","):
            for workers in sizes:
                base = measure(model, workers, "local", address, args.repeat)
                for mode in MODES:
                    train_s, wall = (base if mode == "local"
                                     else measure(model, workers, mode, address, args.repeat))
                    ratio = wall / base[1]
                    met = "" if mode == "local" or "+" in mode or workers not in GOALS else (
                        f"≤ {GOALS[workers]:.0f}×: "
                        + ("met" if ratio <= GOALS[workers] else "not met"))
                    verdicts.append(met)
                    print(f"| {model} | {workers} | {mode} | {train_s:.2f} | "
                          f"{train_s / base[0]:.2f}× | {wall:.2f} | {ratio:.2f}× | "
                          f"{wall - train_s:.2f} | {met} |",
                          flush=True)
    finally:
        cluster.close()
    print()
    print(f"whole-trial goals met: {sum('not' not in v for v in verdicts if v)} of "
          f"{sum(1 for v in verdicts if v)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
