"""Search efficiency on one cell: compute that TPE + pruning needs to get within 5 % of the
best value an exhaustive grid finds, as a fraction of the exhaustive grid's compute.

Compute is counted in training examples processed (examples seen, summed over trials). Both
searches use the pipeline's objective (``tasks.trial.objective``: simulated seconds to the
target accuracy), the pipeline's trial configuration and, for TPE, its sampler and Hyperband
pruner (resource: examples seen). Trials train with the engine in ``local`` mode: the same math
and the same simulated time as on P ranks (``n_workers`` per update is still P's), without
the Dask round trips, so the benchmark runs in minutes.

Run: ``python bench/search_efficiency.py [--seeds 0,1,2] [--max-trials 20]``.
Goal: TPE + pruning within 5 % of the grid's best with <= 20 % of the grid's compute.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", type=int, default=4)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=float, default=6.0)
    parser.add_argument("--factors", default="1.5,2,3,5,8")
    parser.add_argument("--delays", default="1,2,3,4,6")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-trials", type=int, default=20)
    args = parser.parse_args(argv)

    import optuna

    from damptune import StopTraining, TrainData, train
    from damptune.records import EvalRecord, Record
    from models import load_dataset
    from tasks.grid import Cell, GridSettings
    from tasks.search import distributions, pruner_for, sampler_for
    from tasks.trial import objective, trial_config

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cell = Cell(args.network, "geodamp", args.model)
    settings = GridSettings(epochs=args.epochs)
    target = settings.target_for(args.model)
    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    n_train = len(ds.y_train)

    def run(params: dict, trial: optuna.Trial | None = None) -> tuple[float, int, bool]:
        config = trial_config(settings, cell, params, ds)
        config.mode = "local"

        def on_record(record: Record) -> None:
            if not isinstance(record, EvalRecord):
                return
            if record.test_accuracy >= target:
                raise StopTraining("target")
            if trial is not None:
                trial.report(1 - record.test_accuracy, step=int(record.examples_seen))
                if trial.should_prune():
                    raise StopTraining("pruned")

        state = train(config, data, callback=on_record)
        pruned = state.stopped == "pruned"
        return objective(state.history, target=target)[0], state.examples_seen, pruned

    # the exhaustive grid
    grid = list(itertools.product([float(f) for f in args.factors.split(",")],
                                  [int(d) for d in args.delays.split(",")]))
    grid_values, grid_compute = [], 0
    for factor, delay in grid:
        value, examples, _ = run({"factor": factor, "delay": delay})
        grid_values.append(value)
        grid_compute += examples
    best = min(grid_values)
    goal = 1.05 * best
    print(f"cell n{args.network}/geodamp/{args.model}, target accuracy {target}, "
          f"{args.epochs:g} epochs max")
    print(f"exhaustive grid: {len(grid)} trials, best {best:.4g} s, "
          f"compute {grid_compute} examples")

    # TPE + Hyperband, as the pipeline runs them
    space = distributions(settings, cell)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        settings.seed = seed
        study = optuna.create_study(direction="minimize", sampler=sampler_for(settings),
                                    pruner=pruner_for(settings, n_train))
        compute, reached_at = 0, None
        for _ in range(args.max_trials):
            trial = study.ask(space)
            value, examples, pruned = run(dict(trial.params), trial)
            compute += examples
            if pruned:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, value)
                if value <= goal and reached_at is None:
                    reached_at = (len(study.trials), compute)
                    break
        rows.append((seed, reached_at, study.best_value if study.best_trials else None))

    print()
    print("| seed | trials to within 5 % | compute (examples) | fraction of grid compute |")
    print("|---|---|---|---|")
    fractions = []
    for seed, reached_at, _ in rows:
        if reached_at is None:
            print(f"| {seed} | not within {args.max_trials} trials | - | - |")
            continue
        n, compute = reached_at
        fractions.append(compute / grid_compute)
        print(f"| {seed} | {n} | {compute} | {compute / grid_compute:.1%} |")
    if fractions:
        med = statistics.median(fractions)
        print(f"\nmedian fraction {med:.1%} (goal <= 20 %: {'met' if med <= 0.2 else 'not met'}; "
              f"{len(fractions)}/{len(rows)} seeds reached the goal value)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
