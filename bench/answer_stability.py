"""Is the grid's answer stable? Two or more complete runs of the default grid, each with its own
sampler seed and its own held-out training seeds, on one dataset: do they agree?

The runs use the ``tune`` flow with its defaults (all four network sizes, all six algorithms,
both models, targets, budgets, the adaptive search, warm start, bound pruning and the
validation stage: each cell's best configuration retrained on ``validation_seeds`` held-out
seeds), except the seed (``--seeds``, default 0 and 1; it seeds the search's training, the
sampler and the held-out seeds), ``--trials`` per cell, ``--validation-seeds`` and, by default,
``--mode local``: every trial trains in the flow's process, the same math and the same
simulated time as on ranks (the cross-mode oracle, tests/damptune/test_modes.py). All train on
the same data (``--data-seed``, default 0).

The answer of a run is its report's (``tasks.stats``): per (network, model) pair, each
algorithm's mean over the held-out seeds with a 95 % CI, its speedup over ``geodamplr`` paired
by seed, and the tied-best set.

Goals (issue 74, item 7), over every pair of the N >= 2 grids compared: calibration, |z| >
1.96 in <= 10 % of the rows both grids of a pair answer, in each pair; type-S, 0 comparisons
with the baseline significant in both grids of a pair with opposite signs; headline spread,
the best reliable damped speedup's max / min over the grids <= 1.10 in every (network, model);
baseline CV, the between-grid CV of the baseline's mean <= 5 % per model. The verdict is met
only when all four are.

In detail (pure functions over answers, lists of row dicts: :func:`measures`):

* **calibration**: for each row both grids of a pair answer (same network, model and
  algorithm, >= 2 held-out seeds in each), z = (mean_A - mean_B) / sqrt(se_A^2 + se_B^2), se =
  the standard deviation of the row's seed values / sqrt(n) (from the values, not from ``ci``).
  If each grid's interval held all the uncertainty of its answer, about 5 % of the rows would
  have |z| > 1.96; the goal allows 10 % per pair. Printed: the count, the share, the worst rows;
* **type-S**: an algorithm's speedup over ``geodamplr`` whose 95 % interval excludes 1 in both
  grids, above 1 in one and below in the other: a sign error, the one disagreement a reader
  would act on. Goal: none;
* **headline spread**: per (network, model), the best speedup over ``geodamplr`` of a reliable
  damped algorithm (any but ``geodamplr``, ``cntsdamplr`` and ``sgd``, which do not grow the
  batch; ``geodamp-matched`` counts) in each grid; the spread is the largest over the smallest
  across the grids. Goal: <= 1.10 in every (network, model): the headline moves by <= 10 %;
* **baseline CV**: the between-grid CV (standard deviation / mean over the grids) of
  ``geodamplr``'s mean, per model (per network and model where the baseline's row differs by
  network): every speedup divides by it. Goal: <= 5 %.

Not a goal any more: 0 contradictions (issue 24's goal; two algorithms significantly ordered one
way in one grid and the other way in the other, each comparison at a plain 95 %). Each pair of
grids makes 20-30 comparisons of near-tied algorithms, and the search's variance (which
configuration each grid's search answers with) sits outside the held-out seeds' intervals, so
about 1-1.5 contradictions are expected by chance, and the count rises as the intervals tighten
(more held-out seeds): a goal of 0 failed grids that agree as well as grids can. Calibration
measures the same effect per row, against the share a calibrated interval expects. Still
printed per pair, as information: the contradictions (plain and family-wise), each run's best in
the other's tied-best set, the resolution (median 95 % CI half-width of the speedup over the
baseline) and the best damped speedups per network size.

Run: ``python bench/answer_stability.py [--seeds 0,1,...] [--trials 8] [--validation-seeds 8]
[--mode local] [--data-seed 0] [--objective budget --target mlp=0.6,cnn=0.83]``, or on N >= 2
finished grids ``python -m bench answer_stability
--run-dirs A,B[,C...] [--held-out 3,4,6]``: ``--held-out`` also answers from each grid's first K
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
    ``validation_seeds=K`` would have answered: the configuration was chosen on selection
    seeds, so fewer estimation seeds change only what measures it)."""
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
        print(f"  {run_dir}, first {held_out} estimation seeds: trial seconds on those "
              f"seeds {first:.0f} of the held-out stages' {every:.0f} (search {search:.0f})")
    rows = answer_rows(share_rows(valid), baseline=BASE)
    pairs: Answer = {}
    for row in rows:
        pairs.setdefault((row["network"], row["model"]), []).append(row)
    return pairs


def _seconds(trial) -> float:
    """A trial's seconds from start to complete, as Optuna stored them; 0 when unfinished."""
    if trial.datetime_start is None or trial.datetime_complete is None:
        return 0.0
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def stage_seconds(run_dir: str) -> dict[str, float]:
    """Trial seconds (start to complete, as Optuna stored them) of a finished grid per stage:
    ``search``, ``replica`` (the baseline's repeated searches), ``selection``, ``validation``
    (the estimation seeds) and ``matched``: what each part of the answer costs."""
    import optuna

    storage = f"sqlite:///{run_dir}/optuna.db"
    out: dict[str, float] = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        attrs = summary.user_attrs
        stage = "replica" if attrs.get("replica") else str(attrs.get("stage", "search"))
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        out[stage] = out.get(stage, 0.0) + sum(_seconds(t) for t in study.get_trials(
            deepcopy=False))
    return {k: round(v, 1) for k, v in sorted(out.items())}


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


# -- the four measures (issue 74, item 7): pure functions over answers, lists of row dicts --

Rows = list[dict[str, Any]]  # an answer's rows: network, model, algorithm, mean, values, ...
Key = tuple[int, str, str]  # a row's (network, model, algorithm)
NOT_GROWING = (BASELINE, "cntsdamplr", "sgd")  # no headline: these do not grow the batch
Z_95 = 1.96
GOAL_SHARE, GOAL_SPREAD, GOAL_CV = 0.10, 1.10, 0.05
GOAL = (f"calibration: |z| > {Z_95} in <= {100 * GOAL_SHARE:.0f} % of the rows both grids "
        f"answer, in each pair of grids; type-S: 0 comparisons with {BASELINE} significant in "
        "both grids of a pair with opposite signs; headline spread (max / min over the grids of "
        f"the best reliable damped speedup) <= {GOAL_SPREAD:.2f} in every (network, model); "
        f"baseline CV (between-grid stdev / mean of {BASELINE}'s mean) <= {100 * GOAL_CV:.0f} % "
        "per model")


def rows_of(answer: Answer) -> Rows:
    """An answer's rows, every (network, model) pair's together."""
    return [r for rows in answer.values() for r in rows]


def _keyed(rows: Rows) -> dict[Key, dict[str, Any]]:
    return {(r["network"], r["model"], r["algorithm"]): r for r in rows}


def z_score(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """(mean_A - mean_B) / sqrt(se_A^2 + se_B^2) of one row two grids answer, se = the stdev of
    the row's seed values / sqrt(n); None when either has fewer than 2 seeds."""
    va, vb = list(a["values"].values()), list(b["values"].values())
    if len(va) < 2 or len(vb) < 2:
        return None
    diff = a["mean"] - b["mean"]
    se = math.sqrt(statistics.variance(va) / len(va) + statistics.variance(vb) / len(vb))
    if se == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / se


def calibration(a: Rows, b: Rows, worst: int = 3) -> dict[str, Any]:
    """The rows two answers share (>= 2 seeds in each): how many, how many with |z| > 1.96,
    their share (None with no row), and the ``worst`` (key, z) by |z|."""
    ka, kb = _keyed(a), _keyed(b)
    zs = [(k, z) for k in sorted(set(ka) & set(kb)) if (z := z_score(ka[k], kb[k])) is not None]
    outside = sum(abs(z) > Z_95 for _, z in zs)
    return {"rows": len(zs), "outside": outside, "share": outside / len(zs) if zs else None,
            "worst": sorted(zs, key=lambda kz: -abs(kz[1]))[:worst]}


def _sign(row: dict[str, Any]) -> int:
    """+1 when the speedup's interval lies above 1, -1 below, 0 when it holds 1 (or none)."""
    low, high = row.get("speedup_low"), row.get("speedup_high")
    if low is None or high is None:
        return 0
    return 1 if low > 1.0 else -1 if high < 1.0 else 0


def type_s(a: Rows, b: Rows) -> list[tuple[Key, float, float]]:
    """(key, speedup in A, speedup in B) of each comparison with the baseline that is
    significant in both answers with opposite signs."""
    ka, kb = _keyed(a), _keyed(b)
    return [(k, ka[k]["speedup"], kb[k]["speedup"]) for k in sorted(set(ka) & set(kb))
            if _sign(ka[k]) * _sign(kb[k]) < 0]


def headline(rows: Rows) -> dict[tuple[int, str], float | None]:
    """Per (network, model), the best speedup over the baseline of a reliable damped algorithm
    (not in ``NOT_GROWING``); None where there is none."""
    out: dict[tuple[int, str], float | None] = {}
    for r in rows:
        best = out.setdefault((r["network"], r["model"]), None)
        if r["algorithm"] in NOT_GROWING or not r["reliable"] or r["speedup"] is None:
            continue
        out[r["network"], r["model"]] = r["speedup"] if best is None else max(best, r["speedup"])
    return out


def headline_spread(answers: list[Rows]) -> dict[tuple[int, str], dict[str, Any]]:
    """Per (network, model) any answer has: each answer's headline and their max / min (None
    when an answer has none)."""
    heads = [headline(rows) for rows in answers]
    out = {}
    for pair in sorted({p for h in heads for p in h}):
        best = [h.get(pair) for h in heads]
        ok = all(v is not None and v > 0 for v in best)
        out[pair] = {"best": best, "spread": max(best) / min(best) if ok else None}
    return out


def _cv(means: list[float | None]) -> float | None:
    if len(means) < 2 or any(m is None for m in means) or not statistics.fmean(means):
        return None
    return statistics.stdev(means) / statistics.fmean(means)


def baseline_cv(answers: list[Rows]) -> dict[str, float | None]:
    """The baseline's mean's CV over the answers, per model ("cnn"), or per network and model
    ("n4 cnn") where the baseline's means differ by network in some answer."""
    means: dict[tuple[int, str], list[float | None]] = {}
    for i, rows in enumerate(answers):
        for r in rows:
            if r["algorithm"] == BASELINE:
                means.setdefault((r["network"], r["model"]), [None] * len(answers))[i] = r["mean"]
    out: dict[str, float | None] = {}
    for model in sorted({m for _, m in means}):
        mine = {n: v for (n, m), v in sorted(means.items()) if m == model}
        if all(v == next(iter(mine.values())) for v in mine.values()):
            out[model] = _cv(next(iter(mine.values())))
        else:
            out.update({f"n{n} {model}": _cv(v) for n, v in mine.items()})
    return out


def measures(runs: dict[Any, Rows]) -> dict[str, Any]:
    """The four measures over every pair of the answers ``runs`` (label -> rows) and whether
    each met its goal (``met``; ``met["all"]``: the verdict)."""
    labels = sorted(runs)
    pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]]
    cal = {f"{a}-{b}": calibration(runs[a], runs[b]) for a, b in pairs}
    signs = {f"{a}-{b}": type_s(runs[a], runs[b]) for a, b in pairs}
    spread = headline_spread([runs[s] for s in labels])
    cv = baseline_cv([runs[s] for s in labels])
    met = {"calibration": bool(cal) and all(c["rows"] and c["share"] <= GOAL_SHARE
                                            for c in cal.values()),
           "type_s": bool(signs) and not any(signs.values()),
           "headline_spread": bool(spread) and all(
               h["spread"] is not None and h["spread"] <= GOAL_SPREAD for h in spread.values()),
           "baseline_cv": bool(cv) and all(v is not None and v <= GOAL_CV for v in cv.values())}
    met["all"] = all(met.values())
    return {"labels": labels, "calibration": cal, "type_s": signs, "headline_spread": spread,
            "baseline_cv": cv, "met": met}


def measure_figures(m: dict[str, Any]) -> dict[str, Any]:
    """:func:`measures` as a record's figures: per pair, per (network, model), per model."""
    return {"grids": len(m["labels"]), "met": m["met"],
            "calibration": {p: {k: c[k] for k in ("rows", "outside", "share")}
                            for p, c in m["calibration"].items()},
            "type_s": {p: len(v) for p, v in m["type_s"].items()},
            "headline_spread": {f"n{n} {model}": h["spread"]
                                for (n, model), h in m["headline_spread"].items()},
            "baseline_cv": m["baseline_cv"]}


def print_measures(m: dict[str, Any]) -> None:
    """The four measures, each with its goal and verdict, the worst rows of each pair."""
    verdict = {k: records.verdict_of(v) for k, v in m["met"].items()}
    print(f"\n## the four measures over {len(m['labels'])} grids (runs {m['labels']})")
    print(f"calibration, |z| > {Z_95} per pair (goal <= {100 * GOAL_SHARE:.0f} % in each; "
          f"about 5 % if each interval held all the uncertainty): {verdict['calibration']}")
    for pair, c in m["calibration"].items():
        share = "-" if c["share"] is None else f"{100 * c['share']:.1f} %"
        print(f"  runs {pair}: {c['outside']} of {c['rows']} rows ({share}); the worst: "
              + ", ".join(f"n{k[0]} {k[1]} {k[2]} z {z:+.2f}" for k, z in c["worst"]))
    print(f"type-S, speedups over {BASELINE} significant in both grids with opposite signs "
          f"(goal 0): {sum(len(v) for v in m['type_s'].values())}, {verdict['type_s']}")
    for pair, found in m["type_s"].items():
        for k, sa, sb in found:
            print(f"  runs {pair}: n{k[0]} {k[1]} {k[2]} {sa:.2f}x and {sb:.2f}x")
    print(f"headline spread, the best reliable damped speedup's max / min over the grids (goal "
          f"<= {GOAL_SPREAD:.2f} in every (network, model)): {verdict['headline_spread']}")
    for (n, model), h in m["headline_spread"].items():
        best = ", ".join("-" if v is None else f"{v:.2f}x" for v in h["best"])
        spread = "-" if h["spread"] is None else f"{h['spread']:.3f}"
        print(f"  n{n} {model}: {spread} ({best})")
    print(f"baseline CV, {BASELINE}'s mean over the grids (goal <= {100 * GOAL_CV:.0f} %): "
          f"{verdict['baseline_cv']}; " + ", ".join(
              f"{k} {'-' if v is None else f'{100 * v:.1f} %'}"
              for k, v in m["baseline_cv"].items()))
    print(f"verdict (all four): {verdict['all']}")


def report(runs: dict[int, Answer]) -> dict[str, float]:
    """Print the comparison of two runs' answers, as information (no goal: the module's
    docstring says why); return its figures."""
    a, b = sorted(runs)[:2]
    pairs = sorted(set(runs[a]) & set(runs[b]))
    print(f"\n## runs {a} and {b}")
    print("| pair | " + " | ".join(f"run {s}: mean s [tied best*]" for s in (a, b)) + " |")
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
    print(f"\ncontradictions (significantly ordered both ways, each at a plain 95 %; no goal, "
          f"about 1-1.5 expected by chance): {contradictions}")
    for p, orders in both_ways.items():
        for x, y in orders:
            print(f"  n{p[0]} {p[1]}: {x} < {y} in run {b}, {y} < {x} in run {a}; "
                  + "; ".join(f"{alg} {_config(runs, a, p, alg)} in run {a}, "
                              f"{_config(runs, b, p, alg)} in run {b}" for alg in (x, y)))
            print(f"    {x}'s time over {y}'s, paired by seed: " + ", ".join(
                f"run {s} {_paired(runs[s][p], x, y)}" for s in (a, b)))
    _family_wise_contradictions(runs, pairs)
    print(f"each run's best in the other's tied-best set: {agree} of {len(pairs)} pairs")
    _tied_sizes(runs, pairs)
    print(f"resolution: median 95 % CI half-width of the speedup over {BASELINE}: "
          f"{width:.1%} ({len(widths)} intervals)")
    _by_model(runs, pairs, both_ways)
    return {"contradictions": contradictions, "best_in_other_tied_set": agree,
            "pairs": len(pairs), "median_ci_half_width": width}


def compare(runs: dict[int, Answer]) -> dict[str, Any]:
    """Print each pair of runs' comparison (:func:`report`), the best damped speedups and the
    four measures (:func:`measures`); return the figures, the measures' and per pair the
    report's (``pairwise``)."""
    labels = sorted(runs)
    pairwise = {f"{a}-{b}": report({a: runs[a], b: runs[b]})
                for i, a in enumerate(labels) for b in labels[i + 1:]}
    _speedups(runs, sorted(set.intersection(*(set(runs[s]) for s in labels))))
    m = measures({s: rows_of(runs[s]) for s in labels})
    print_measures(m)
    return {**measure_figures(m), "pairwise": pairwise}


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
            print(f"  run {s} {model}: " + "; ".join(parts))


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


def _arguments(argv: list[str] | None) -> argparse.Namespace:
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
                        help="A,B[,C...]: compare N >= 2 finished grids' run directories, every "
                        "pair of them (e.g. `make run`'s runs/grid and a `damptune tune --seed "
                        "1` of the same grid) instead of running them")
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
    given = args.run_dirs or args.seeds
    if len(set(given)) < 2 or len(set(given)) < len(given):
        option = "--run-dirs" if args.run_dirs else "--seeds"
        parser.error(f"{option}={','.join(map(str, given))} is not accepted; expected 2 or more "
                     "distinct grids to compare")
    return args


def _diagnose(run_dirs: list[str]) -> None:
    """What each finished grid's held-out and search trials did (reading its database)."""
    for title, report in (
            ("held-out trainings (validation and matched) that missed the target", misses),
            ("near misses retrained beside their search's best", near_misses),
            ("search trials that asked a pruned configuration again", re_asks),
            ("search trials with the value of an earlier trial of their cell (a flat region)",
             flat_trials)):
        print(f"{title}:")
        for run_dir in run_dirs:
            report(run_dir)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if args.run_dirs:
        runs: dict[int, Any] = {i: answer_of(d) for i, d in enumerate(args.run_dirs)}
        print("finished grids compared: " + ", ".join(
            f"run {i} {d}" for i, d in enumerate(args.run_dirs)))
        _diagnose(args.run_dirs)
    else:
        print(f"default grid, seeds {args.seeds}, data seed {args.data_seed}, "
              f"{args.trials or 'the default'} trials per cell, {args.validation_seeds} "
              f"held-out seeds per cell, mode {args.mode}")
        runs = {s: run_grid(s, args) for s in args.seeds}
    held_out_noise(runs)
    figures = compare(runs)
    if args.run_dirs:  # what each stage of each grid cost, in trial seconds
        figures["stage_seconds"] = {d: stage_seconds(d) for d in args.run_dirs}
        for d, costs in figures["stage_seconds"].items():
            total = sum(costs.values())
            print(f"trial seconds of {d}: " + ", ".join(
                f"{k} {v:.0f} ({100 * v / total:.0f} %)" for k, v in costs.items()))
    for k in args.held_out or []:
        print(f"\n## the first {k} held-out seeds of each grid")
        figures[f"first_{k}_held_out"] = compare(
            {i: answer_of(d, held_out=k) for i, d in enumerate(args.run_dirs)})
    records.write("answer_stability", figures=figures, run_dirs=args.run_dirs,
                  goals={GOAL: figures["met"]["all"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
