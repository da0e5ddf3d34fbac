"""How long does a whole trial take in the two data-parallel modes against ``local`` (same
math, one process)?

One fixed trial per model (issue 11's: ``damptune train --model cnn --dataset mnist1d --damper
geodamp --initial 32 --param factor=2 --param delay=1 --epochs 6 --per-worker-batch 32``, and the
same with ``--model mlp``), at P_max = 1, 4 and 16, in ``local``, ``centralized`` and
``decentralized`` mode, each also with ``--eval-flush`` (``+flush``: every evaluation ends
the ranks' segment, as before ``eval_flush``; no goal), and in ``centralized`` mode with the
P ranks on fewer workers (``/N``: ``--processes N``, each worker running several ranks' shares
of the batch: what a grid does on ``cluster="local"``, whose ``workers_per_trial`` is the cores
over the trials at once, 1 on this 2-core machine with its two trials at once; a lone trial
would get 2). The Dask cluster (16 single-threaded
workers) is started once and warmed by one trial first, as in the pipeline, whose cluster lives
for the whole grid. Each figure is the median of ``--repeat`` runs, all in this run.

Prints training seconds (the engine's ``time_elapsed``) and whole-trial seconds (``fit`` from
call to return: group formation, segments, teardown) as ratios to ``local``, and their
difference: the trial's cost outside its updates (the medians' difference), which varies less
with the machine's load than either.

Goal: whole-trial time ≤ 2× local at P_max = 4 and ≤ 3× at P_max = 16 (on a 2-core machine,
where every rank shares the same two cores, ``local`` is the floor).

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

from bench import records  # noqa: E402

GOALS = {4: 2.0, 16: 3.0}
# the rows: a mode, and whether each evaluation ends the ranks' segment (``--eval-flush``:
# what a grid with a report-reading pruner does, and what every trial did before `eval_flush`)
# ``/N``: the ranks on N workers (``--processes N``), as a grid on a machine of few cores
MODES = ("local", "centralized", "decentralized", "centralized+flush", "decentralized+flush",
         "centralized/2", "centralized/1")


def trial(model: str, workers: int, mode: str, scheduler: str) -> list[str]:
    mode, _, processes = mode.partition("/")
    mode, _, flush = mode.partition("+")
    return ["train", "--model", model, "--dataset", "mnist1d", "--damper", "geodamp",
            "--initial", "32", "--param", "factor=2", "--param", "delay=1", "--epochs", "6",
            "--workers", str(workers), "--per-worker-batch", "32", "--mode", mode,
            "--scheduler", scheduler, "--json", "--no-progress",
            *(["--eval-flush"] if flush else []),
            *(["--processes", processes] if processes else [])]


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


def verdict(mode: str, workers: int, ratio: float) -> str:
    """The goal's verdict of one row ("" where no goal applies: local, +flush, P_max 1)."""
    if mode == "local" or "+" in mode or workers not in GOALS:
        return ""
    return f"≤ {GOALS[workers]:.0f}×: " + ("met" if ratio <= GOALS[workers] else "not met")


def rows(args: argparse.Namespace, address: str,
         modes: list[str]) -> list[tuple[str, str, int, str, float]]:
    """Print one row per (model, P_max, mode); return (mode, verdict, P_max, model, whole-trial
    ratio to local) per row."""
    out = []
    for model in args.models.split(","):
        for workers in args.sizes:
            base = measure(model, workers, "local", address, args.repeat)
            for mode in modes:
                if "/" in mode and int(mode.split("/")[1]) >= workers:
                    continue  # as many workers as ranks: the row without "/"
                train_s, wall = (base if mode == "local"
                                 else measure(model, workers, mode, address, args.repeat))
                ratio = wall / base[1]
                out.append((mode, verdict(mode, workers, ratio), workers, model, ratio))
                print(f"| {model} | {workers} | {mode} | {train_s:.2f} | "
                      f"{train_s / base[0]:.2f}× | {wall:.2f} | {ratio:.2f}× | "
                      f"{wall - train_s:.2f} | {out[-1][1]} |", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from damptune.cluster import local_cluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--workers", default="1,4,16",
                        help="P_max values (1: a trial as the grid runs it on a machine of few "
                        "cores, one worker per trial; no goal)")
    parser.add_argument("--modes", default=",".join(MODES[1:]),
                        help=f"rows besides local, a subset of {','.join(MODES[1:])}")
    args = parser.parse_args(argv)
    args.sizes = [int(w) for w in args.workers.split(",")]
    modes = ["local", *(m for m in args.modes.split(",") if m)]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; accepted: {','.join(MODES[1:])}")
    cluster = local_cluster(n_workers=max(args.sizes), local_directory="runs/bench-dask")
    address = cluster.scheduler_address
    print(f"{os.cpu_count()} cores; {max(args.sizes)} single-threaded Dask workers, warm; "
          f"median of {args.repeat} runs")
    print()
    print("| model | P_max | mode | train s | ratio | whole-trial s | ratio | outside training s "
          "| goal |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        run_once(trial("cnn", max(args.sizes), "decentralized", address))  # warm the workers
        verdicts = rows(args, address, modes)
    finally:
        cluster.close()
    print()
    for label, packed in (("a worker per rank", False), ("the ranks on fewer workers", True)):
        these = [v for m, v, *_ in verdicts if v and ("/" in m) == packed]
        if these:
            print(f"whole-trial goals met, {label}: "
                  f"{sum('not' not in v for v in these)} of {len(these)}")
    goals: dict[str, bool | None] = {}
    for p_max, limit in GOALS.items():
        for label, packed in (("a worker per rank", False), ("ranks on fewer workers", True)):
            these = [r for m, v, w, _, r in verdicts if v and w == p_max and ("/" in m) == packed]
            goals[f"whole trial <= {limit:g}x local at P_max {p_max}, {label}"] = (
                all(r <= limit for r in these) if these else None)
    records.write("trial_throughput", goals=goals, repeat=args.repeat, figures={
        f"{model}_p{w}_{m}_over_local": r for m, _, w, model, r in verdicts if m != "local"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
