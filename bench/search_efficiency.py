"""How much compute does the grid's adaptive search need to get within 5 % of the best value an
exhaustive grid finds, against random search, with and without warm start?

Per cell (different algorithms, network sizes and models, one whose target comes late in
training) and per seed:

* **exhaustive**: a grid of at least 25 points over the damper's search space, every point
  trained to its target or its budget (no pruning): its best value is the reference, its
  compute (examples trained, summed) the unit;
* **adaptive**: the pipeline's search (``tasks.search.sampler_for``: TPE or GP, seeded per
  trial, 3 start-up trials; the ``bound`` pruning: a trial stops once its simulated time
  exceeds the best value so far);
* **random**: Optuna's RandomSampler with the same pruning;
* **warm**: the adaptive search, its first trial the best configuration the adaptive search
  found on the neighbour cell (the nearest smaller network, as the flow's warm start does).

A search stops by its own rule: ``--budget`` trials, or ``--patience`` trials in a row
without improving its best. It never sees the exhaustive grid's best. Compute to within 5 %:
the examples trained up to and including the first trial whose value is within 5 % of the
exhaustive best, as a fraction of the exhaustive grid's compute ("never" when the search
stopped first).

Trials train with the engine in ``local`` mode (the same math and simulated time as on P
ranks, without the cluster, so the benchmark runs in minutes), with the pipeline's trial
configuration and objective (``tasks.trial.trial_config``, ``tasks.objective.objective``).

Run: ``python bench/search_efficiency.py [--seeds 0,1,2] [--samplers auto,tpe,gp]``.
Goals (medians over cells and seeds): adaptive ≤ 20 % of the grid's compute; adaptive ≤ ½ of
random; warm start ≤ ½ of the compute without it.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

# (network, algorithm, model): the exhaustive grid's axes per algorithm
CELLS = [(4, "geodamp", "mlp"), (16, "padadamp", "mlp"), (8, "adadamp", "cnn")]
GRIDS: dict[str, dict[str, list[Any]]] = {
    "geodamp": {"factor": [1.5, 2.0, 3.0, 5.0, 8.0], "delay": [1, 2, 3, 5, 8]},
    "padadamp": {"rate": [round(0.01 * 1000 ** (i / 24), 4) for i in range(25)]},
    "adadamp": {"initial": [8, 16, 32, 64, 128], "dwell": [1, 3, 10, 30, 100]},
}
WITHIN = 1.05
Trial = tuple[float, int, dict[str, Any], bool]  # value, examples, params, reached the target


class Trainer:
    """Trains one configuration of a cell with the pipeline's trial configuration."""

    def __init__(self, cell: Any, settings: Any) -> None:
        from damptune import TrainData
        from models import load_dataset

        self.cell, self.settings = cell, settings
        self.ds = load_dataset(settings.dataset, seed=settings.seed)
        self.data = TrainData.from_arrays(self.ds.X_train, self.ds.y_train, self.ds.X_test,
                                          self.ds.y_test)
        self.calibration: dict[str, float] = {}

    def __call__(self, params: dict[str, Any],
                 bound: float | None) -> tuple[float, int, bool, float]:
        """(value, examples trained, pruned by the bound, shortfall: target − best accuracy,
        0 when it reached the target)."""
        import dataclasses

        from damptune import calibrate, train
        from tasks.objective import objective
        from tasks.trial import trial_config

        config = trial_config(self.settings, self.cell, params, self.ds, bound=bound)
        config = dataclasses.replace(config, mode="local", **self.calibration)
        if not self.calibration:
            config = calibrate(config, self.data)
            self.calibration = {k: getattr(config, k) for k in (
                "compute_fixed", "compute_per_example", "compute_forward_fixed",
                "compute_forward_per_example", "compute_norm")}
        state = train(config, self.data)
        value, reached, best = objective(state.history, target=config.target_accuracy)
        pruned = not reached and bound is not None and state.time_sim >= bound
        return value, state.examples_seen, pruned, 0.0 if reached else (
            config.target_accuracy - best)


def exhaustive(trainer: Trainer, algorithm: str) -> tuple[float, int, dict[str, Any]]:
    """(best value, compute, best params) of the full grid, no pruning: the fastest point
    that reached the target (the least value when none did)."""
    axes = GRIDS[algorithm]
    best, compute, best_params = (True, math.inf), 0, {}
    for values in itertools.product(*axes.values()):
        params = dict(zip(axes, values, strict=True))
        value, examples, _, shortfall = trainer(params, None)
        compute += examples
        if (shortfall > 0, value) < best:
            best, best_params = (shortfall > 0, value), params
    return best[1], compute, best_params


def search(trainer: Trainer, *, sampler: str, seed: int, budget: int, patience: int,
           seeds: tuple[dict[str, Any], ...] = ()) -> list[Trial]:
    """The (value, examples, params, reached) of each trial of one search, in order, until its
    own rule stops it."""
    import optuna

    from tasks.search import TARGET_CONSTRAINT, distributions, sampler_for

    settings = trainer.settings
    space = distributions(settings, trainer.cell)
    study = optuna.create_study(direction="minimize")
    for params in seeds:
        study.enqueue_trial(params)
    trials: list[Trial] = []
    best, since = (True, math.inf), 0  # (missed the target, value): the search's best
    for number in range(budget):
        study.sampler = (optuna.samplers.RandomSampler(seed=seed * 1000 + number)
                         if sampler == "random" else sampler_for(
                             _with(settings, sampler=sampler, seed=seed), number,
                             trainer.cell.key, len(space)))
        trial = study.ask(space)
        # the bound: the best value of a trial that reached the target (as tasks.search)
        value, examples, pruned, shortfall = trainer(trial.params, None if best[0] else best[1])
        trials.append((value, examples, dict(trial.params), shortfall <= 0))
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            trial.set_constraint(TARGET_CONSTRAINT, shortfall)
            study.tell(trial, value)
        since = 0 if (shortfall > 0, value) < best else since + 1
        best = min(best, (shortfall > 0, value))
        if since >= patience:
            break
    return trials


def _with(settings: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(settings, **changes)


def fraction(trials: list[Trial], best: float,
             grid_compute: int) -> float:
    """Compute to the first trial that reached the target within 5 % of ``best``, as a
    fraction of the grid's; inf when the search stopped first."""
    spent = 0
    for value, examples, _, reached in trials:
        spent += examples
        if reached and value <= WITHIN * best:
            return spent / grid_compute
    return math.inf


def fmt(x: float) -> str:
    return "never" if math.isinf(x) else f"{100 * x:.1f} %"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def run_cell(cell_t: tuple[int, str, str], args: argparse.Namespace,
             samplers: list[str]) -> dict[str, list[float]]:
    """Every search of one cell and seed; the fractions by search kind."""
    from tasks.grid import Cell, GridSettings
    from tasks.search import sampler_kind

    network, algorithm, model = cell_t
    out: dict[str, list[float]] = {}
    for seed in args.seeds:
        settings = GridSettings(seed=seed)
        trainer = Trainer(Cell(network, algorithm, model), settings)
        best, compute, best_params = exhaustive(trainer, algorithm)
        kw = {"seed": seed, "budget": args.budget, "patience": args.patience}
        row: dict[str, float] = {}
        dims = len(GRIDS[algorithm])
        for kind in [*samplers, "random"]:  # "auto" is gp or tpe: the same trials, run once
            same = sampler_kind(kind, dims)
            row[kind] = next((row[k] for k in row if sampler_kind(k, dims) == same),
                             None) or fraction(search(trainer, sampler=kind, **kw), best, compute)
        neighbour = Trainer(Cell(network // 2, algorithm, model), settings)
        found = search(neighbour, sampler="auto", **kw)
        seed_params = min(found, key=lambda t: (not t[3], t[0]))[2]
        row["warm"] = fraction(search(trainer, sampler="auto", seeds=(seed_params,), **kw),
                               best, compute)
        for key, value in row.items():
            out.setdefault(key, []).append(value)
        print(f"| n{network}/{algorithm}/{model} | {seed} | {best:.3f} s ({best_params}) | "
              f"{compute:,} | " + " | ".join(fmt(row[k]) for k in (*samplers, "random", "warm"))
              + " |", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import optuna

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=lambda t: [int(s) for s in t.split(",")],
                        default=[0, 1, 2])
    parser.add_argument("--samplers", default="auto,tpe,gp")
    parser.add_argument("--cells", default=",".join(f"n{n}/{a}/{m}" for n, a, m in CELLS),
                        help="e.g. n4/geodamp/mlp,n16/padadamp/mlp")
    parser.add_argument("--budget", type=int, default=15, help="trials per search at most")
    parser.add_argument("--patience", type=int, default=8,
                        help="stop after this many trials without improvement")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    samplers = args.samplers.split(",")
    print(f"budget {args.budget} trials, patience {args.patience}; compute to within 5 % of "
          "the exhaustive best, as a fraction of the exhaustive grid's compute\n")
    print("| cell | seed | exhaustive best | grid compute (examples) | "
          + " | ".join(samplers) + " | random | warm (auto) |")
    print("|---|---|---|---|" + "---|" * (len(samplers) + 2))
    results: dict[str, list[float]] = {}
    cells = [(int(c.split("/")[0][1:]), *c.split("/")[1:]) for c in args.cells.split(",")]
    for cell in cells:
        for key, values in run_cell(cell, args, samplers).items():
            results.setdefault(key, []).extend(values)
    print()
    med = {k: _median(v) for k, v in results.items()}
    for key in (*samplers, "random", "warm"):
        print(f"median {key}: {fmt(med[key])}")
    if "auto" not in med:  # the goals are the pipeline's search's (auto)
        print("Goals: not judged (run with --samplers auto to judge them)")
        auto = random_ = warm = math.nan
    else:
        auto, random_, warm = med["auto"], med["random"], med["warm"]
        _print_goals(auto, random_, warm)
    judged = "auto" in med
    records.write("search_efficiency", figures={f"median_{k}": v for k, v in med.items()},
                  seeds=args.seeds, cells=args.cells, budget=args.budget,
                  patience=args.patience, goals={
                      "adaptive (auto) <= 20 % of the grid's compute":
                      auto <= 0.2 if judged else None,
                      "adaptive <= 1/2 of random": auto <= 0.5 * random_ if judged else None,
                      "warm start <= 1/2 of without": warm <= 0.5 * auto if judged else None})
    return 0


def _print_goals(auto: float, random_: float, warm: float) -> None:
    print(f"Goal: adaptive (auto) <= 20 % of the grid's compute: {fmt(auto)}: "
          + ("met" if auto <= 0.2 else "not met"))
    print(f"Goal: adaptive <= 1/2 of random: {auto / random_ if random_ else math.nan:.2f}: "
          + ("met" if auto <= 0.5 * random_ else "not met"))
    print(f"Goal: warm start <= 1/2 of without: {warm / auto if auto else math.nan:.2f}: "
          + ("met" if warm <= 0.5 * auto else "not met"))


if __name__ == "__main__":
    raise SystemExit(main())
