"""Is the grid's answer stable? The default grid's settings, run with two seeds: does each
(network, model) pair name the same best damping algorithm, and rank the algorithms alike?

Both runs use the `tune` flow with its defaults (all four network sizes, all six algorithms,
both models, targets and budgets, the adaptive search, warm start and pruning), except the
seed (model initialization, data order, sampler), ``--trials`` per cell (stated in the output) and,
by default, ``--mode local``: every trial trains in the flow's process, the same math and the
same simulated time as on ranks (the cross-mode oracle, tests/damptune/test_modes.py), so the
two grids take minutes rather than two ``make run``s. ``--mode centralized`` runs them on
ranks. Both runs train on the same data (``--data-seed``, default 0, the flow's
``data_seed``), as a user's grid would on its own dataset; ``--data-seed same`` gives each run
the dataset of its seed, as every grid did before ``data_seed`` existed.

It prints, per pair, each seed's ranking; then:

* the fraction of pairs whose best algorithm is the same in both runs (goal ≥ 80 %);
* the mean Spearman correlation of the two rankings (goal ≥ 0.8);
* how often the best damped algorithm (``geodamp``, ``padadamp``, ``adadamp``, ``radadamp``:
  the batch grows) beats ``geodamplr`` (step learning-rate decay, the AdaDamp paper's
  baseline) by at least 1.5× at the largest network, and whether that speedup grows with the
  network size, as the paper found;
* exact ties between different algorithms' best values within a pair.

Run: ``python bench/answer_stability.py [--seeds 0,1] [--trials 6] [--mode local]
[--data-seed 0|same]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DAMPED = ("geodamp", "padadamp", "adadamp", "radadamp")
BASELINE = "geodamplr"


Best = tuple[float, bool]  # a cell's best value and whether that trial reached the target


def run_grid(seed: int, args: argparse.Namespace) -> dict[tuple[int, str], dict[str, Best]]:
    """Best value (and reached) per (network, model) pair and algorithm, for one seed."""
    from flows.tune import tune

    data_seed = seed if args.data_seed == "same" else int(args.data_seed)
    name = f"stability-s{seed}-d{data_seed}"
    rows = tune(seed=seed, data_seed=data_seed, trials=args.trials, mode=args.mode,
                grid_name=name, run_dir=os.path.join(args.run_dir, name))
    pairs: dict[tuple[int, str], dict[str, Best]] = {}
    for row in rows:
        if row["best_value"] is not None:
            pairs.setdefault((row["network"], row["model"]), {})[row["algorithm"]] = (
                float(row["best_value"]), bool(row["reached"]))
    return pairs


def ranking(values: dict[str, Best]) -> list[str]:
    """Algorithms that reached the target first, fastest first; then those that missed."""
    return sorted(values, key=lambda a: (not values[a][1], values[a][0], a))


def spearman(a: list[str], b: list[str]) -> float:
    """Spearman's rank correlation of two rankings of the same items."""
    common = [x for x in a if x in b]
    n = len(common)
    if n < 2:
        return float("nan")
    ra = {x: i for i, x in enumerate(x for x in a if x in common)}
    rb = {x: i for i, x in enumerate(x for x in b if x in common)}
    d2 = sum((ra[x] - rb[x]) ** 2 for x in common)
    return 1 - 6 * d2 / (n * (n * n - 1))


def speedup(values: dict[str, Best]) -> float | None:
    """The baseline's time over the best damped algorithm's, both having reached the target."""
    damped = [values[a][0] for a in DAMPED if a in values and values[a][1]]
    if BASELINE not in values or not values[BASELINE][1] or not damped:
        return None
    return values[BASELINE][0] / min(damped)


def ties(values: dict[str, Best]) -> int:
    seen = [v for v, reached in values.values() if reached]
    return sum(1 for i, x in enumerate(seen) for y in seen[i + 1:] if x == y)


def report(runs: dict[int, dict[tuple[int, str], dict[str, Best]]]) -> None:
    seeds = sorted(runs)
    pairs = sorted(set.intersection(*(set(r) for r in runs.values())))
    print("| pair | " + " | ".join(f"seed {s}: ranking (best first)" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    for pair in pairs:
        print(f"| n{pair[0]} {pair[1]} | " + " | ".join(
            ", ".join(f"{a} {runs[s][pair][a][0]:.2f}" + ("" if runs[s][pair][a][1] else
                                                           " (missed)")
                      for a in ranking(runs[s][pair]))
            for s in seeds) + " |")
    a, b = seeds[0], seeds[1]
    same = [ranking(runs[a][p])[0] == ranking(runs[b][p])[0] for p in pairs]
    rho = [spearman(ranking(runs[a][p]), ranking(runs[b][p])) for p in pairs]
    frac, mean_rho = sum(same) / len(same), statistics.mean(rho)
    print(f"\nsame best algorithm in both runs: {sum(same)} of {len(same)} pairs ({frac:.0%});"
          f" goal >= 80 %: {'met' if frac >= 0.8 else 'not met'}")
    print(f"mean Spearman correlation of the rankings: {mean_rho:.2f}; goal >= 0.8: "
          f"{'met' if mean_rho >= 0.8 else 'not met'}")
    _paper_questions(runs, pairs)


def _paper_questions(runs: dict[int, dict[tuple[int, str], dict[str, Best]]],
                     pairs: list[tuple[int, str]]) -> None:
    largest = max(n for n, _ in pairs)
    models = sorted({m for _, m in pairs})
    wins = [speedup(runs[s][(largest, m)]) for s in runs for m in models
            if (largest, m) in runs[s]]
    big = [w for w in wins if w is not None and w >= 1.5]
    print(f"best damped algorithm >= 1.5x faster than {BASELINE} at n{largest}: {len(big)} of "
          f"{len(wins)} (seed x model) runs; speedups "
          + ", ".join("-" if w is None else f"{w:.2f}x" for w in wins))
    for s in sorted(runs):
        for m in models:
            ups = [(n, speedup(runs[s][(n, mm)])) for n, mm in pairs if mm == m]
            values = [u for _, u in ups if u is not None]
            grows = all(x <= y for x, y in zip(values, values[1:], strict=False))
            print(f"  seed {s} {m}: speedup by network " + ", ".join(
                f"n{n} {'-' if u is None else f'{u:.2f}x'}" for n, u in ups)
                + f" -> grows with network size: {'yes' if grows else 'no'}")
    n_ties = sum(ties(runs[s][p]) for s in runs for p in pairs)
    print(f"exact ties between algorithms' best values within a pair: {n_ties} "
          "(goal: at most 1 per grid)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1])
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per cell (default: the flow's)")
    parser.add_argument("--mode", default="local")
    parser.add_argument("--data-seed", default="0",
                        help="the dataset's seed in every run (default 0), or 'same': each "
                        "run's own seed")
    parser.add_argument("--run-dir", default=os.path.join("runs", "answer-stability"))
    args = parser.parse_args(argv)
    if args.data_seed != "same" and not args.data_seed.isdigit():
        parser.error(f"--data-seed={args.data_seed!r} is not accepted; expected an integer >= 0 "
                     "or 'same'")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if args.trials is None:
        from flows.tune import flow_defaults

        args.trials = flow_defaults()["trials"]
    data = "each run's seed" if args.data_seed == "same" else args.data_seed
    print(f"default grid, seeds {args.seeds}, data seed {data}, {args.trials} trials per cell, "
          f"mode {args.mode}")
    runs: dict[int, Any] = {s: run_grid(s, args) for s in args.seeds}
    report(runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
