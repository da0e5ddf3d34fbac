"""Where a finished grid's trials went, from its Optuna storage; and whether two grids trained
the same trials.

For each run directory: trials by state and stage (search; held-out: validation and matched),
the search stage's span (first trial start to last search trial end), the held-out stage after
it, trials finished within 300 / 450 / 600 s of the first trial's start (this machine's pace
on the day: compare grids run on different days by it), trial seconds (Optuna start to
complete) per stage, trials that reused another's training (``tasks.reuse``) and their
seconds, how many trials trained at once, on average over the grid's span, and in how many
warm-started search cells the best is a configuration warm start carried from a neighbour
(``seeded_from``): the search's own trials did not beat it on the search's seed.

With two run directories of one grid (same grid name, seed and data), it also compares their
trials one by one: the same (study, number) with the same state, value, parameters and
training seed. A grid that reused trainings must match one that did not, every trial.

Run: ``python bench/grid_trials.py --run-dirs A[,B]``
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WINDOWS = (300, 450, 600)


def trials_of(run_dir: str) -> dict[tuple[str, int], Any]:
    """(study name without the grid, number) → frozen trial, for every trial of the grid."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{run_dir}/optuna.db"
    out = {}
    for s in optuna.get_all_study_summaries(storage):
        cell = s.study_name.split("/", 1)[1]
        for t in optuna.load_study(study_name=s.study_name, storage=storage).trials:
            out[(cell, t.number)] = t
    return out


def _held_out(cell: str) -> bool:
    return _stage(cell) != "search"


def _seconds(trials: list[Any]) -> float:
    return sum((t.datetime_complete - t.datetime_start).total_seconds()
               for t in trials if t.datetime_complete and t.datetime_start)


def describe(run_dir: str, trials: dict[tuple[str, int], Any]) -> None:
    """Print one grid's figures (see the module's docstring)."""
    from collections import Counter

    from tasks.reuse import REUSED_ATTR

    done = [(k, t) for k, t in trials.items() if t.datetime_complete and t.datetime_start]
    search = [t for (cell, _), t in done if not _held_out(cell)]
    held = [t for (cell, _), t in done if _held_out(cell)]
    reused = [(k, t) for k, t in done if REUSED_ATTR in t.user_attrs]
    first = min(t.datetime_start for _, t in done)
    last = max(t.datetime_complete for _, t in done)
    search_end = max(t.datetime_complete for t in search)
    within = [sum((t.datetime_complete - first).total_seconds() <= w for _, t in done)
              for w in WINDOWS]
    span = (last - first).total_seconds()
    trained = [t for _, t in done if REUSED_ATTR not in t.user_attrs]
    reused_seconds = _seconds([t for _, t in reused])
    print(f"{run_dir}: {len(trials)} trials {dict(Counter(t.state.name for t in trials.values()))}"
          f"; {len(search)} search, {len(held)} held-out")
    print(f"  search stage {search_end - first}; held-out stage after it {last - search_end}; "
          f"first trial start to last end {last - first}")
    print(f"  finished within {' / '.join(map(str, WINDOWS))} s of the first start: "
          f"{' / '.join(map(str, within))}")
    print(f"  trial seconds: search {_seconds(search):.0f}, held-out {_seconds(held):.0f}; "
          f"{len(reused)} reused another's training ({reused_seconds:.1f} s; "
          f"{dict(Counter(_stage(cell) for (cell, _), _ in reused))})")
    print(f"  trials training at once, mean over the span: {_seconds(trained) / span:.2f}")
    print_carried(trials)


def print_carried(trials: dict[tuple[str, int], Any]) -> None:
    """How many warm-started search cells kept a carried configuration as their best, and
    how many of those cells' trials the bound pruned."""
    from tasks.search import best_trial, reached_target

    cells: dict[str, list[Any]] = {}
    for (cell, _), t in trials.items():
        if not _held_out(cell):
            cells.setdefault(cell, []).append(t)
    seeded = {c: ts for c, ts in cells.items() if any("seeded_from" in t.user_attrs for t in ts)}
    bests = {c: best_trial(ts) for c, ts in seeded.items()}
    answered = [c for c, b in bests.items() if b is not None and reached_target(b)]
    carried = [c for c in answered if "seeded_from" in bests[c].user_attrs]
    pruned = sum(t.state.name == "PRUNED" for ts in seeded.values() for t in ts)
    print(f"  warm-started search cells: {len(seeded)}; the best a carried configuration in "
          f"{len(carried)} of the {len(answered)} that reached the target; "
          f"{pruned} of their {sum(map(len, seeded.values()))} trials pruned")


def _stage(cell: str) -> str:
    from tasks.grid import Cell

    return Cell.from_key(cell).stage


def _same(t: Any) -> tuple[Any, ...]:
    return t.state.name, t.value, t.params, t.user_attrs.get("train_seed")


def compare(a: dict[tuple[str, int], Any], b: dict[tuple[str, int], Any]) -> bool:
    """Print how many trials the two grids share with the same outcome; True if all do."""
    common = set(a) & set(b)
    differ = sorted(k for k in common if _same(a[k]) != _same(b[k]))
    print(f"trials in both: {len(common)} (only in the first {len(set(a) - common)}, only in "
          f"the second {len(set(b) - common)}); the same state, value, parameters and seed: "
          f"{len(common) - len(differ)}")
    for k in differ[:10]:
        print(f"  differs: {k[0]}#{k[1]}: {_same(a[k])[:2]} against {_same(b[k])[:2]}")
    return not differ and set(a) == set(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dirs", required=True, help="one or two run directories, A[,B]")
    dirs = parser.parse_args(argv).run_dirs.split(",")
    grids = [trials_of(d) for d in dirs]
    for d, trials in zip(dirs, grids, strict=True):
        describe(d, trials)
    if len(grids) == 2:
        print("the two grids trained the same trials: "
              f"{'yes' if compare(*grids) else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
