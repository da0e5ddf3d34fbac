"""How much of a grid trial's compute is evaluation, and which evaluations.

A grid trial evaluates on the test set (1,000 examples of MNIST-1D) after the update whose
examples seen grew 2 % since the last evaluation (``eval_resolution``; in the first 0.4 epoch,
where 2 % is less than a batch, after every update), after every update while the last
evaluation was within 6 points below the target (``eval_dense_margin``), and every epoch. This
trains fixed configurations (``bench/objective_noise.py``'s, network 16) exactly as a grid trial
trains them, in ``local`` mode (one process, one torch thread, as a rank), stopped at the
target, and times the evaluations inside the training (the engine's ``LocalOps.evaluate``,
wrapped here) against the whole ``train``. Each evaluation is put in one class by the
evaluation before it: ``dense`` (that one was within the margin: this one resolves the first
crossing on its own update), ``first epoch`` (examples seen below one epoch: nearly all from
the 2 % rule while a batch is more than 2 % of the examples seen), ``growth/regular`` (the
rest); the classes count recorded evaluations.

Each configuration trains with ``eval_checks`` off and on, alternated, ``--repeats`` times
each (the seconds are min / median / max). With checks, an evaluation the regular schedule did
not ask for that lands more than the margin below the target records nothing and stops as soon
as that is certain (the same training and crossing: ``tests/damptune/
test_objective_resolution.py``). It prints, for all configurations, the sum of the median
trial walls with checks over that without.

No goal: it says where a trial's time goes, and what the checks save.
Run: ``nice -n 10 python bench/eval_share.py [--configs mlp/geodamp,cnn/geodamplr]
[--repeats 3]``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def timed_evaluations() -> list[tuple[float, bool]]:
    """Wrap ``LocalOps.evaluate`` so that each call's (seconds, whether it was a check that
    stopped early) is appended to the list."""
    from damptune import loop

    calls: list[tuple[float, bool]] = []
    real = loop.LocalOps.evaluate

    def evaluate(self: Any, n_ranks: int, *, at_least: float | None = None
                 ) -> tuple[float, int, int] | None:
        t = time.perf_counter()
        out = None
        try:
            out = real(self, n_ranks, at_least=at_least)
            return out
        finally:
            calls.append((time.perf_counter() - t, out is None))

    loop.LocalOps.evaluate = evaluate  # type: ignore[method-assign]
    return calls


def classes(history: list[dict[str, Any]], *, target: float, margin: float,
            n_train: int) -> collections.Counter[str]:
    """Count the history's evaluations by the class of :mod:`bench/eval_share`'s docstring."""
    out: collections.Counter[str] = collections.Counter()
    last = 0.0
    for r in (r for r in history if r["kind"] == "eval"):
        if last >= target - margin:
            out["dense"] += 1
        elif r["examples_seen"] < n_train:
            out["first epoch"] += 1
        else:
            out["growth/regular"] += 1
        last = r["test_accuracy"]
    return out


def run_config(name: str, ds: Any, data: Any, calibration: dict[str, Any], repeats: int,
               calls: list[tuple[float, bool]]) -> dict[bool, float]:
    """Train ``name`` ``repeats`` times with checks off and on, alternated; print both; the
    median wall seconds of a trial by ``eval_checks``."""
    import objective_noise as on

    from damptune import train
    from tasks.grid import GridSettings

    base = on.trial_run_config(GridSettings(seed=0, data_seed=0, mode="local"), name, ds,
                               calibration, to_budget=False)
    walls: dict[bool, list[float]] = {False: [], True: []}
    evals: dict[bool, list[float]] = {False: [], True: []}
    seen: dict[bool, tuple[list[dict[str, Any]], int]] = {}
    for _ in range(repeats):
        for checks in (False, True):
            calls.clear()
            t = time.perf_counter()
            history = train(dataclasses.replace(base, eval_checks=checks), data).history
            walls[checks].append(time.perf_counter() - t)
            evals[checks].append(sum(s for s, _ in calls))
            seen[checks] = history, sum(1 for _, early in calls if early)
    for checks in (False, True):
        history, early = seen[checks]
        counts = classes(history, target=float(base.target_accuracy),
                         margin=base.eval_dense_margin, n_train=len(ds.y_train))
        updates = sum(1 for r in history if r["kind"] == "update")
        share = [e / w for e, w in zip(evals[checks], walls[checks], strict=True)]
        print(f"{name} checks {'on ' if checks else 'off'}: {updates} updates, "
              f"{sum(counts.values())} evaluations recorded "
              f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), "
              f"{early} checks stopped early; train {spread(walls[checks])} s, of it "
              f"evaluation {spread(evals[checks])} s, share {spread(share, '.0%')}", flush=True)
    return {c: statistics.median(w) for c, w in walls.items()}


def spread(values: list[float], fmt: str = ".2f") -> str:
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values),
                                                max(values)))


def main(argv: list[str] | None = None) -> int:
    import objective_noise as on
    import torch

    from damptune import TrainData
    from models import load_dataset

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--configs", default=",".join(on.CONFIGS),
                        help=f"a subset of {','.join(on.CONFIGS)}")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in on.CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; accepted: {','.join(on.CONFIGS)}")
    torch.set_num_threads(1)
    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    calibrations = {m: on.calibration_for(m, ds, data) for m in {on.CONFIGS[n][0] for n in names}}
    calls = timed_evaluations()
    print(f"local mode, network {on.NETWORK}, seed 0, one torch thread; "
          "min / median / max of " f"{args.repeats}", flush=True)
    medians = [run_config(name, ds, data, calibrations[on.CONFIGS[name][0]], args.repeats,
                          calls) for name in names]
    ratio = sum(m[True] for m in medians) / sum(m[False] for m in medians)
    print(f"all configurations: a trial with checks / without, sum of median walls: "
          f"{ratio:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
