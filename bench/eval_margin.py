"""How dense must evaluation be near the target? The grid's objective is the simulated time of
the first evaluation reaching the target; test accuracy is noisy, so a sparse evaluation grid
finds a later crossing than an evaluation after every update would.

For 7 configurations of 6 dampers on each model (the grid's trial configuration at 8 ranks, the
default budgets and targets, ``local`` mode), it trains once with an evaluation after every
update (the reference), then replays the engine's evaluation rule on that history: every
``eval_every`` epoch, every 2 % of growth in examples seen, and after every update while the
last evaluation was within the margin below the target. It prints, per margin, the worst
ratio of the replayed time to target to the reference's, and how many evaluations each needs
(the reference evaluates every update). The grid's default margin is the smallest with no
ratio above 1.02.

Run: ``python bench/eval_margin.py [--margins 0,0.02,0.03,0.05,0.06,0.08]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIGS = [("geodamplr", {"factor": 2.0, "delay": 4}), ("geodamp", {"factor": 2.0, "delay": 3}),
           ("padadamp", {"rate": 0.1}), ("cntsdamplr", {"c": 0.05}),
           ("adadamp", {"initial": 32, "dwell": 10}), ("radadamp", {"rho": 0.9}),
           ("geodamp", {"factor": 3.0, "delay": 2})]


def dense_histories() -> dict[tuple[str, str, str], list[dict]]:
    from damptune import TrainData, train
    from models import load_dataset
    from tasks.grid import Cell, GridSettings
    from tasks.trial import trial_config

    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    grid, out = GridSettings(), {}
    for model in ("mlp", "cnn"):
        for algorithm, params in CONFIGS:
            cfg = dataclasses.replace(
                trial_config(grid, Cell(8, algorithm, model), params, ds), mode="local",
                eval_resolution=1e-9, eval_dense_margin=0.0, target_accuracy=None,
                compute_per_example=1e-5, compute_fixed=1e-4, compute_forward_per_example=3e-6,
                compute_forward_fixed=1e-5, compute_norm=1e-6)
            state = train(cfg, data)
            out[(model, algorithm, str(params))] = [r for r in state.history
                                                    if r["kind"] == "eval"]
    return out


def replay(evals: list[dict], *, target: float, margin: float) -> tuple[int | None, int]:
    """(index of the first evaluation the rule finds at or above target, evaluations made)."""
    last_examples, last_acc, made, epoch = 0, 0.0, 0, 1.0
    for i, r in enumerate(evals):
        due = (r["examples_seen"] >= 1.02 * last_examples or r["epoch"] >= epoch
               or (margin > 0 and last_acc >= target - margin))
        if not due:
            continue
        made += 1
        last_examples, last_acc = r["examples_seen"], r["test_accuracy"]
        while epoch <= r["epoch"]:
            epoch += 1.0
        if last_acc >= target:
            return i, made
    return None, made


def main(argv: list[str] | None = None) -> int:
    from tasks.grid import GridSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--margins", default="0,0.02,0.03,0.05,0.06,0.08")
    args = parser.parse_args(argv)
    histories, grid = dense_histories(), GridSettings()
    print("| margin | worst ratio to the reference | runs above 1.02 | evaluations "
          "(reference: every update) |")
    print("|---|---|---|---|")
    for margin in (float(m) for m in args.margins.split(",")):
        worst, misses, made, dense = 1.0, 0, 0, 0
        for (model, _, _), evals in histories.items():
            target = grid.target_for(model)
            first = next((i for i, r in enumerate(evals) if r["test_accuracy"] >= target), None)
            if first is None:
                continue
            found, n = replay(evals, target=target, margin=margin)
            ratio = (evals[found]["time_sim"] / evals[first]["time_sim"]
                     if found is not None else float("inf"))
            worst, misses = max(worst, ratio), misses + (ratio > 1.02)
            made, dense = made + n, dense + first + 1
        print(f"| {margin:g} | {worst:.3f} | {misses} | {made} ({dense}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
