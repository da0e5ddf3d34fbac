"""Is the grid's answer stable? Two complete runs of the default grid, each with its own
sampler seed and its own held-out training seeds, on one dataset: do they agree?

Both runs use the ``tune`` flow with its defaults (all four network sizes, all six algorithms,
both models, targets, budgets, the adaptive search, warm start, bound pruning and the
validation stage: each cell's best configuration retrained on ``validation_seeds`` held-out
seeds), except the seed (run A: 0, run B: 1; it seeds the search's training, the sampler and
the held-out seeds), ``--trials`` per cell, ``--validation-seeds`` and, by default,
``--mode local``: every trial trains in the flow's process, the same math and the same
simulated time as on ranks (the cross-mode oracle, tests/damptune/test_modes.py). Both train on
the same data (``--data-seed``, default 0).

The answer of a run is its report's (``tasks.stats``): per (network, model) pair, each
algorithm's mean over the held-out seeds with a 95 % CI, its speedup over ``geodamplr`` paired
by seed, and the tied-best set.

Goals (issue 24): 0 contradictions; each run's best in the other's tied-best set in >= 7 of 8
pairs; the median 95 % CI half-width of the speedup over the baseline <= 10 %.

In detail:

* **0 contradictions**: no two algorithms significantly ordered one way in one run and the
  other way in the other (each of the pair's comparisons at a plain 95 %, stricter than the
  report's family-wise tied-best set; also printed family-wise, Bonferroni over the pair's
  k (k - 1) / 2 comparisons, the level at which all of them may be stated at once);
* the best algorithm of each run is in the other run's tied-best set (the report's, family-wise
  over the comparisons with the best since the session of 2026-11-28; also printed with plain
  95 % intervals, as before, and the sets' mean size) in >= 7 of 8 pairs;
* **resolution**: the median 95 % CI half-width of the speedup over the baseline (relative to
  the speedup) is <= 10 %, so that "everything is tied" cannot pass;
* printed: the best damped algorithm's speedup at each network size, with its CI, both runs.

Run: ``python bench/answer_stability.py [--seeds 0,1] [--trials 8] [--validation-seeds 8]
[--mode local] [--data-seed 0] [--objective budget --target mlp=0.6,cnn=0.83]``, or on two
finished grids ``python bench/answer_stability.py
--run-dirs A,B [--held-out 3,4,6]``: ``--held-out`` also answers from each grid's first K
held-out seeds only, what grids with ``validation_seeds=K`` would have answered (the seeds
are a prefix; a cell whose answer misses on most of its K seeds would have retrained a
runner-up the grid may not have: counted, and answered by its search's best). The fewer
seeds, the less the validation stage costs: the trade-off issue 24 asks for.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

DAMPED = ("geodamp", "padadamp", "adadamp", "radadamp")
BASELINE = "geodamplr"


Answer = dict[tuple[int, str], list[dict[str, Any]]]  # pair -> its rows, ranked by mean


def answer_of(run_dir: str, held_out: int | None = None) -> Answer:
    """The answer a finished grid's run directory holds (its report's statistics); with
    ``held_out`` K, the answer of its first K held-out seeds (what a grid with
    ``validation_seeds=K`` would have answered, but for :func:`unsettled`'s cells)."""
    import json

    from tasks.answer import BASELINE as BASE
    from tasks.grid import share_rows
    from tasks.stats import answer_rows
    from tasks.validation import validation_rows

    with open(os.path.join(run_dir, "grid.json")) as f:
        name = json.load(f)["grid_name"]
    valid = validation_rows(f"sqlite:///{run_dir}/optuna.db", grid_name=name,
                            first_seeds=held_out)
    if held_out is not None:
        first, every, search = trial_seconds(run_dir, held_out)
        print(f"  {run_dir}, first {held_out} held-out seeds: {unsettled(valid)} of "
              f"{len(valid)} cells would have retrained a runner-up this grid did not "
              f"(answered by the search's best); trial seconds on those seeds {first:.0f} of "
              f"the held-out stages' {every:.0f} (search {search:.0f})")
    rows = answer_rows(share_rows(valid), baseline=BASE)
    pairs: Answer = {}
    for row in rows:
        pairs.setdefault((row["network"], row["model"]), []).append(row)
    return pairs


def unsettled(rows: list[dict[str, Any]]) -> int:
    """Validation rows whose answer did not reach the target on most of its seeds while the
    cell retrained fewer configurations than it may: a grid with these seeds only would have
    retrained the next runner-up."""
    from tasks.stats import mostly_reached
    from tasks.validation import CANDIDATES

    return sum(1 for r in rows if r["retrained"] < CANDIDATES
               and not mostly_reached(list(r["reached"].values()), r["n_seeds"]))


def _seconds(trial) -> float:
    """A trial's seconds from start to complete, as Optuna stored them; 0 when unfinished."""
    if trial.datetime_start is None or trial.datetime_complete is None:
        return 0.0
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def trial_seconds(run_dir: str, held_out: int) -> tuple[float, float, float]:
    """Seconds of trials (start to complete, as Optuna stored them) of a grid: held-out trials
    (validation and matched) on its first ``held_out`` seeds, on all seeds, and search."""
    import optuna

    from tasks.validation import SEEDED, STAGES, TRAIN_SEED

    storage = f"sqlite:///{run_dir}/optuna.db"
    out = [0.0, 0.0, 0.0]
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        held = summary.user_attrs.get("stage") in STAGES
        first = set((summary.user_attrs.get(SEEDED) or [])[:held_out])
        for t in study.get_trials(deepcopy=False):
            seconds = _seconds(t)
            if not held:
                out[2] += seconds
                continue
            out[1] += seconds
            out[0] += seconds if t.user_attrs.get(TRAIN_SEED) in first else 0.0
    return out[0], out[1], out[2]


def run_grid(seed: int, args: argparse.Namespace) -> Answer:
    """The answer of one complete run of the default grid with ``seed``."""
    from flows.tune import tune

    name = f"stability-s{seed}-d{args.data_seed}"
    run_dir = os.path.join(args.run_dir, name)
    params = dict(seed=seed, data_seed=int(args.data_seed), mode=args.mode, grid_name=name,
                  run_dir=run_dir, validation_seeds=args.validation_seeds)
    for key in ("trials", "networks", "algorithms", "models", "objective"):
        if getattr(args, key) is not None:  # a smaller grid: a smoke test of this script
            params[key] = getattr(args, key)
    if args.target is not None:
        params["target_accuracy"] = args.target
    try:
        tune(**params)
    except Exception as exc:  # noqa: BLE001 - an incomplete grid is reported, then measured
        print(f"run {name}: {exc}")
    return answer_of(run_dir)


def significant_orders(rows: list[dict[str, Any]],
                       family_wise: bool = False) -> set[tuple[str, str]]:
    """(faster, slower) for every two algorithms whose paired ratio's CI excludes 1: each at a
    plain 95 %, or ``family_wise`` (Bonferroni over the pair's k (k - 1) / 2 comparisons)."""
    from tasks.stats import paired_ratio

    out = set()
    comparisons = max(1, len(rows) * (len(rows) - 1) // 2) if family_wise else 1
    for x in rows:
        for y in rows:
            low, _, _ = paired_ratio(y["values"], x["values"], comparisons=comparisons)
            if x is not y and low is not None and low > 1.0:
                out.add((x["algorithm"], y["algorithm"]))
    return out


def _relative_half_width(row: dict[str, Any]) -> float | None:
    if row["algorithm"] == BASELINE or row["speedup_low"] is None:
        return None
    return (row["speedup_high"] - row["speedup_low"]) / 2 / row["speedup"]


def report(runs: dict[int, Answer]) -> dict[str, float]:
    """Print the comparison of two runs' answers; return its figures."""
    a, b = sorted(runs)[:2]
    pairs = sorted(set(runs[a]) & set(runs[b]))
    print("| pair | " + " | ".join(f"seed {s}: mean s [tied best*]" for s in (a, b)) + " |")
    print("|---|---|---|")
    for pair in pairs:
        print(f"| n{pair[0]} {pair[1]} | " + " | ".join(", ".join(
            f"{r['algorithm']} {r['mean']:.2f}{'*' if r['tied_best'] else ''}"
            for r in runs[s][pair]) for s in (a, b)) + " |")
    both_ways = _both_ways(runs, pairs)
    contradictions = sum(len(v) for v in both_ways.values())
    agree = sum(_agrees(runs, p) for p in pairs)
    widths = [w for s in (a, b) for p in pairs for r in runs[s][p]
              if (w := _relative_half_width(r)) is not None]
    width = statistics.median(widths) if widths else float("nan")
    print(f"\ncontradictions (significantly ordered both ways): {contradictions}; goal 0: "
          f"{'met' if contradictions == 0 else 'not met'}")
    for p, orders in both_ways.items():
        for x, y in orders:
            print(f"  n{p[0]} {p[1]}: {x} < {y} in run {b}, {y} < {x} in run {a}; "
                  + "; ".join(f"{alg} {_config(runs, a, p, alg)} in run {a}, "
                              f"{_config(runs, b, p, alg)} in run {b}" for alg in (x, y)))
            print(f"    {x}'s time over {y}'s, paired by seed: " + ", ".join(
                f"run {s} {_paired(runs[s][p], x, y)}" for s in (a, b)))
    _family_wise_contradictions(runs, pairs)
    print(f"each run's best in the other's tied-best set: {agree} of {len(pairs)} pairs; "
          f"goal >= 7 of 8: {'met' if agree >= 7 / 8 * len(pairs) else 'not met'}"
          + ("" if len(pairs) == 8 else " (as a share of the pairs)"))
    _tied_sizes(runs, pairs)
    print(f"resolution: median 95 % CI half-width of the speedup over {BASELINE}: "
          f"{width:.1%} ({len(widths)} intervals); goal <= 10 %: "
          f"{'met' if width <= 0.10 else 'not met'}")
    _by_model(runs, pairs, both_ways)
    _speedups(runs, pairs)
    return {"contradictions": contradictions, "best_in_other_tied_set": agree,
            "pairs": len(pairs), "median_ci_half_width": width}


def _by_model(runs: dict[int, Answer], pairs: list[tuple[int, str]],
              both_ways: dict[tuple[int, str], list[tuple[str, str]]]) -> None:
    """The contradictions (``both_ways``, :func:`report`'s) and the best-in-the-other's-
    tied-best count per model: whether a change to one model's setting moved that model's
    figures or the other's draws."""
    for model in sorted({p[1] for p in pairs}):
        mine = [p for p in pairs if p[1] == model]
        print(f"  {model}: {sum(len(both_ways[p]) for p in mine)} contradictions; best in the "
              f"other's tied-best set in {sum(_agrees(runs, p) for p in mine)} of {len(mine)} "
              "pairs")


def _agrees(runs: dict[int, Answer], pair: tuple[int, str]) -> bool:
    """Whether each run's best algorithm of ``pair`` is in the other run's tied-best set."""
    a, b = sorted(runs)[:2]
    tied = {s: {r["algorithm"] for r in runs[s][pair] if r["tied_best"]} for s in (a, b)}
    return runs[a][pair][0]["algorithm"] in tied[b] and runs[b][pair][0]["algorithm"] in tied[a]


def _family_wise_contradictions(runs: dict[int, Answer], pairs: list[tuple[int, str]]) -> None:
    """The contradictions again, each pair's comparisons family-wise (Bonferroni over all of
    them): whether the plain count is orderings a simultaneous 95 % statement would not make."""
    b = sorted(runs)[1]
    both = [(p, x, y) for p, orders in _both_ways(runs, pairs, True).items() for x, y in orders]
    print(f"  family-wise over each pair's k (k - 1) / 2 comparisons: {len(both)} contradictions"
          + "".join(f"; n{p[0]} {p[1]}: {x} < {y} in run {b}" for p, x, y in both))


def _both_ways(runs: dict[int, Answer], pairs: list[tuple[int, str]],
               family_wise: bool = False) -> dict[tuple[int, str], list[tuple[str, str]]]:
    """Per pair, the (x, y) significantly ordered x < y in the second run and y < x in the
    first (``significant_orders``, plain or family-wise)."""
    a, b = sorted(runs)[:2]
    return {p: sorted({(y, x) for x, y in significant_orders(runs[a][p], family_wise)}
                      & significant_orders(runs[b][p], family_wise)) for p in pairs}


def _plain_tied(rows: list[dict[str, Any]]) -> set[str]:
    """The tied-best set with a plain 95 % interval per comparison with the best (the report's
    rule before it was family-wise)."""
    from tasks.stats import vs_best

    return {r["algorithm"] for r, (_, tied) in zip(rows, vs_best(rows, 1), strict=True) if tied}


def _tied_sizes(runs: dict[int, Answer], pairs: list[tuple[int, str]]) -> None:
    """How wide the tied-best sets are, family-wise and plain, and the agreement with plain
    sets: what the family-wise rule buys in agreement, and what it costs in resolution."""
    a, b = sorted(runs)[:2]
    plain = {(s, p): _plain_tied(runs[s][p]) for s in (a, b) for p in pairs}
    agree = sum(runs[a][p][0]["algorithm"] in plain[b, p]
                and runs[b][p][0]["algorithm"] in plain[a, p] for p in pairs)
    sizes = {s: [sum(r["tied_best"] for r in runs[s][p]) for p in pairs] for s in (a, b)}
    plain_sizes = {s: [len(plain[s, p]) for p in pairs] for s in (a, b)}
    print(f"  with plain 95 % intervals per comparison: {agree} of {len(pairs)} pairs; "
          "tied-best set size, mean over the pairs (family-wise; plain): " + ", ".join(
              f"run {s} {statistics.fmean(sizes[s]):.2f}; {statistics.fmean(plain_sizes[s]):.2f}"
              f" of {statistics.fmean(len(runs[s][p]) for p in pairs):.0f}" for s in (a, b)))


def _config(runs: dict[int, Answer], run: int, pair: tuple[int, str], algorithm: str) -> str:
    """The configuration that answers for ``algorithm`` in one run's pair, and its mean: a
    contradiction between two configurations that differ comes from the searches, not
    from the held-out seeds."""
    row = next(r for r in runs[run][pair] if r["algorithm"] == algorithm)
    params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in sorted(row["params"].items()))
    return f"({params}; {row['mean']:.2f} s)"


def _paired(rows: list[dict[str, Any]], x: str, y: str) -> str:
    """``x``'s time over ``y``'s on each held-out seed both finished: the mean ratio and its
    standard deviation over the seeds (what a paired comparison's interval rests on)."""
    vx, vy = (next(r for r in rows if r["algorithm"] == alg)["values"] for alg in (x, y))
    ratios = [vx[seed] / vy[seed] for seed in sorted(set(vx) & set(vy)) if vy[seed]]
    if len(ratios) < 2:
        return f"{len(ratios)} seed(s) in common"
    return (f"mean {statistics.fmean(ratios):.3f} (SD {statistics.stdev(ratios):.3f}, "
            f"{min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} seeds)")


def _speedups(runs: dict[int, Answer], pairs: list[tuple[int, str]]) -> None:
    from tasks.validation import MATCHED, MATCHED_SUFFIX

    for label, names in (("best damped algorithm", DAMPED),
                         ("matched comparison (geodamp at the baseline's factor and delay)",
                          (MATCHED[0] + MATCHED_SUFFIX,))):
        print(f"\n{label}: speedup over {BASELINE} [95 % CI], per network size:")
        _speedup_lines(runs, pairs, names)


def _speedup_lines(runs: dict[int, Answer], pairs: list[tuple[int, str]],
                   names: tuple[str, ...]) -> None:
    for s in sorted(runs):
        for model in sorted({m for _, m in pairs}):
            parts = []
            for n in sorted({n for n, m in pairs if m == model}):
                damped = [r for r in runs[s][(n, model)] if r["algorithm"] in names]
                best = damped[0] if damped else None
                parts.append(f"n{n} " + ("-" if best is None or best["speedup"] is None else
                                         f"{best['algorithm']} {best['speedup']:.2f}x"
                                         + (f" [{best['speedup_low']:.2f}, "
                                            f"{best['speedup_high']:.2f}]"
                                            if best["speedup_low"] is not None else "")))
            print(f"  seed {s} {model}: " + "; ".join(parts))


def held_out_noise(runs: dict[int, Answer], goal: float = 0.05) -> None:
    """Per run and model: the CV (sample std / mean) of each answer's objective over its
    held-out seeds, one fixed configuration each (a row shared across network sizes counted
    once): issue 24's objective noise, measured on the configurations the answer rests on."""
    print(f"objective noise of the answers' configurations, CV over their held-out seeds "
          f"(goal <= {100 * goal:.0f} %):")
    for run, pairs in runs.items():
        rows = {r["study"]: r for rs in pairs.values() for r in rs if len(r["values"]) > 1}
        for model in sorted({r["model"] for r in rows.values()}):
            cvs = sorted((statistics.stdev(vs) / statistics.mean(vs), study)
                         for study, r in rows.items() if r["model"] == model
                         for vs in [list(r["values"].values())])
            if not cvs:
                continue
            print(f"  run {run} {model}: median {100 * statistics.median(c for c, _ in cvs):.1f} "
                  f"%, {100 * cvs[0][0]:.1f}-{100 * cvs[-1][0]:.1f} % (the most: "
                  f"{cvs[-1][1].split('/', 1)[1]}); <= {100 * goal:.0f} % in "
                  f"{sum(c <= goal for c, _ in cvs)} of {len(cvs)} configurations")


def misses(run_dir: str) -> None:
    """How the held-out trainings (validation and matched) of a finished grid missed: per model,
    how many missed the target and by how much (target - best accuracy, in points). A small
    median miss means the configurations answered sit at the edge of the target."""
    import optuna

    from tasks.search import TARGET_CONSTRAINT

    storage = f"sqlite:///{run_dir}/optuna.db"
    short: dict[str, list[float]] = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        _, _, _, model, *stage = summary.study_name.split("/")
        if stage:
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            short.setdefault(model, []).extend(
                t.constraints.get(TARGET_CONSTRAINT, 0.0) for t in study.get_trials(
                    deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    for model, values in sorted(short.items()):
        missed = sorted(100 * v for v in values if v > 0)
        spread = (f"; by {statistics.median(missed):.1f} points (median; {missed[0]:.1f} to "
                  f"{missed[-1]:.1f})" if missed else "")
        print(f"  {run_dir} {model}: {len(missed)} of {len(values)} held-out trainings missed "
              f"the target{spread}")


def near_misses(run_dir: str) -> None:
    """The search cells of a finished grid whose near miss (:func:`tasks.search.near_miss`)
    was retrained on the held-out seeds: how many, how many reached the target on most seeds,
    and their held-out trial seconds; each one's shortfall on the search's seed and the
    held-out seeds on which it reached the target."""
    import optuna

    from tasks.search import near_miss, reached_target
    from tasks.stats import mostly_reached
    from tasks.validation import VALIDATES

    storage = f"sqlite:///{run_dir}/optuna.db"
    cells = answered = 0
    seconds, lines = 0.0, []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if summary.user_attrs.get("stage") != "validation":
            continue
        source = summary.study_name.rsplit("/", 1)[0]
        nm = near_miss(optuna.load_study(study_name=source, storage=storage).get_trials())
        if nm is None:
            continue
        name = f"{source.split('/', 1)[1]}#{nm.number}"
        trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials()
        group = [t for t in trials if t.user_attrs.get(VALIDATES) == name]
        done = [t for t in group if t.state == optuna.trial.TrialState.COMPLETE]
        seconds += sum(_seconds(t) for t in done)
        reached = sum(reached_target(t) for t in done)
        ok = mostly_reached([reached_target(t) for t in done], len(group))
        cells, answered = cells + 1, answered + ok
        short = max(nm.constraints.values(), default=0.0)
        lines.append(f"    {name}: {short:.3f} short of the search's target; the target on "
                     f"{reached} of {len(group)} held-out seeds")
    print(f"  {run_dir}: {cells} search cells with a near miss retrained, {answered} reached "
          f"the target on most seeds; held-out trial seconds {seconds:.0f}")
    print("\n".join(lines))


def search_studies(run_dir: str) -> Iterator[tuple[str, list[Any]]]:
    """(cell key, trials) of each search study of a finished grid."""
    import optuna

    storage = f"sqlite:///{run_dir}/optuna.db"
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if summary.user_attrs.get("stage", "search") == "search":
            yield summary.study_name.split("/", 1)[1], optuna.load_study(
                study_name=summary.study_name, storage=storage).get_trials()


def re_asks(run_dir: str, within: float = 0.005) -> None:
    """How many search trials of a finished grid asked (nearly) the configuration of an
    earlier trial of their cell that the bound had pruned: every hyperparameter within
    ``within`` in log10 (a float) or equal (an integer). Optuna's GPSampler, blind to pruned
    trials, asked such points again (``tasks/samplers.py``)."""
    import optuna

    asked, again = 0, 0
    for _, trials in search_studies(run_dir):
        pruned: list[dict[str, Any]] = []
        for t in trials:
            asked += 1
            again += any(_near(t.params, p, within) for p in pruned)
            if t.state == optuna.trial.TrialState.PRUNED:
                pruned.append(t.params)
    print(f"  {run_dir}: {again} of {asked} search trials asked within {within} (log10) of a "
          "pruned trial of their cell")


def flat_trials(run_dir: str) -> None:
    """Per model and algorithm, how many search trials of a finished grid got the very value
    of an earlier trial of their cell: the same trajectory to the target, so their
    configuration did not act before the target was reached (a ``delay`` past the target's
    epoch, for one). Each search trial trains on the grid's one training seed, so two such
    configurations are one experiment, and the search learned nothing from the second."""
    import collections

    from tasks.grid import Cell

    flat: collections.Counter[str] = collections.Counter()
    asked: collections.Counter[str] = collections.Counter()
    for key, trials in search_studies(run_dir):
        cell = Cell.from_key(key)
        kind = f"{cell.algorithm}/{cell.model}"
        seen: set[float] = set()
        for t in trials:
            asked[kind] += 1
            if t.value is not None:
                flat[kind] += t.value in seen
                seen.add(t.value)
    print(f"  {run_dir}: " + "; ".join(f"{k} {flat[k]} of {asked[k]}" for k in sorted(asked)))


def _near(a: dict[str, Any], b: dict[str, Any], within: float) -> bool:
    return a.keys() == b.keys() and all(
        abs(math.log10(a[k]) - math.log10(b[k])) < within if isinstance(a[k], float)
        else a[k] == b[k] for k in a)


def main(argv: list[str] | None = None) -> int:
    from flows.cli import _per_model  # damptune tune's parser of a per-model value

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1])
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per cell (default: the flow's)")
    parser.add_argument("--mode", default="local")
    parser.add_argument("--data-seed", default="0", help="the dataset's seed in every run")
    parser.add_argument("--validation-seeds", type=int, default=8)
    parser.add_argument("--networks", type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--algorithms", type=lambda t: t.split(","))
    parser.add_argument("--models", type=lambda t: t.split(","))
    parser.add_argument("--objective", choices=("target", "budget"),
                        help="the grids' objective (default: the flow's, target)")
    parser.add_argument("--target", type=_per_model(float), metavar="MODEL=ACC,...",
                        help="the grids' target accuracies, e.g. mlp=0.6,cnn=0.83 (default: "
                        "the flow's)")
    parser.add_argument("--run-dirs", type=lambda t: t.split(","),
                        help="A,B: compare two finished grids' run directories (e.g. `make run`'s "
                        "runs/grid and a `damptune tune --seed 1` of the same grid) instead of "
                        "running them")
    parser.add_argument("--run-dir", default=os.path.join("runs", "answer-stability"))
    parser.add_argument("--held-out", type=lambda t: [int(x) for x in t.split(",")],
                        help="with --run-dirs: K1,K2,...: also the answers of each grid's "
                        "first K held-out seeds (fewer seeds: the trade-off)")
    args = parser.parse_args(argv)
    if not args.data_seed.isdigit():
        parser.error(f"--data-seed={args.data_seed!r} is not accepted; expected an integer >= 0")
    if args.held_out and (not args.run_dirs or min(args.held_out) < 1):
        parser.error(f"--held-out={','.join(map(str, args.held_out))} is not accepted; expected "
                     "held-out seed counts >= 1, with --run-dirs A,B")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if not args.run_dirs:
        print(f"default grid, seeds {args.seeds}, data seed {args.data_seed}, "
              f"{args.trials or 'the default'} trials per cell, {args.validation_seeds} "
              f"held-out seeds per cell, mode {args.mode}")
    if args.run_dirs:
        runs: dict[int, Any] = {i: answer_of(d) for i, d in enumerate(args.run_dirs)}
        print(f"finished grids compared: {args.run_dirs} (runs 0 and 1 below)")
        print("held-out trainings (validation and matched) that missed the target:")
        for run_dir in args.run_dirs:
            misses(run_dir)
        print("near misses retrained beside their search's best:")
        for run_dir in args.run_dirs:
            near_misses(run_dir)
        print("search trials that asked a pruned configuration again:")
        for run_dir in args.run_dirs:
            re_asks(run_dir)
        print("search trials with the value of an earlier trial of their cell (a flat region):")
        for run_dir in args.run_dirs:
            flat_trials(run_dir)
    else:
        runs = {s: run_grid(s, args) for s in args.seeds}
    held_out_noise(runs)
    figures: dict[str, Any] = report(runs)
    for k in args.held_out or []:
        print(f"\n## the first {k} held-out seeds of each grid")
        figures[f"first_{k}_held_out"] = report(
            {i: answer_of(d, held_out=k) for i, d in enumerate(args.run_dirs)})
    pairs, width = figures["pairs"], figures["median_ci_half_width"]
    records.write("answer_stability", figures=figures, run_dirs=args.run_dirs, goals={
        "0 contradictions": figures["contradictions"] == 0,
        "each run's best in the other's tied-best set in >= 7 of 8 pairs":
        figures["best_in_other_tied_set"] >= 7 / 8 * pairs if pairs else None,
        "median 95 % CI half-width of the speedup <= 10 %": width <= 0.10 if width == width
        else None})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
