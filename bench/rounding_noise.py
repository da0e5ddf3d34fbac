"""How much of the objective's noise is the seed's? The same training, rounded differently.

``bench/objective_noise.py`` varies the training seed of a fixed configuration and finds the
objective (simulated time to the target) moving by a CV of 3-28 %. This keeps the seed and
perturbs the training by a rounding. Each configuration of ``objective_noise.py`` (``local``
mode, network 16, one compute calibration per model, built as a grid trial builds it and
stopped at the target as a held-out trial is) is trained on each seed three times:

* ``as is``: torch's intra-op threads at 1, as a rank trains;
* ``2 threads``: the same operations, their sums split between two threads, so added up in
  another order (what differs between two machines, or between two numbers of ranks per
  process);
* ``one bit``: one training input of the 40,000 (the first example's first value) moved to
  the next float32, 1 thread: the smallest change a training can see.

Everything else is equal: the weights, the data order, the schedule, the simulated clock. Per
configuration it prints each seed's objective under the three, and each perturbation's
relative difference ``|t − t_as_is| / mean(t, t_as_is)``; then, per perturbation over all
runs, that difference (min / median / max) beside the configurations' seed CV (from the ``as
is`` runs, as ``objective_noise.py`` has it).

If a rounding moves the objective about as much as the seed does, the noise is the training's
sensitivity to any perturbation (a trajectory near the target is chaotic: a difference in
the last bit grows until an evaluation lands on the other side of the target), and no choice
of seeds can remove it: only averaging (held-out seeds) or a criterion less sensitive to one
evaluation can. It also means a grid's trials repeat exactly only where ranks add up their
sums the same way: single-threaded ranks, the same ranks per process.

Run: ``nice -n 10 python bench/rounding_noise.py [--seeds 0,1,2] [--configs
mlp/geodamp,cnn/padadamp]`` (about 5 minutes with the defaults on this machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from objective_noise import CONFIGS, calibration_for, cv, trial_run_config  # noqa: E402

KINDS = ("as is", "2 threads", "one bit")
Runs = dict[str, list[tuple[float, bool]]]  # kind -> (objective, reached) per seed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"a subset of {','.join(CONFIGS)}")
    args = parser.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r}; accepted: integers, comma-separated")
    if len(args.seeds) < 2:
        parser.error(f"--seeds: {args.seeds}; accepted: at least two seeds (a CV needs two)")
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or not args.configs:
        parser.error(f"--configs: {unknown or args.configs}; accepted: {','.join(CONFIGS)}")
    return args


def datasets(ds: Any) -> dict[str, Any]:
    """The training data as is, and with its first input value moved to the next float32."""
    import numpy as np

    from damptune import TrainData

    x = np.array(ds.X_train, dtype=np.float32, copy=True)
    x.flat[0] = np.nextafter(x.flat[0], np.float32(np.inf))
    return {"as is": TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test),
            "one bit": TrainData.from_arrays(x, ds.y_train, ds.X_test, ds.y_test)}


def objective_of(config: Any, data: Any, threads: int) -> tuple[float, bool]:
    """(objective, reached) of ``config`` trained on ``data`` with ``threads`` intra-op
    threads."""
    from damptune import train
    from tasks.objective import objective
    from tasks.session import torch_threads

    with torch_threads(threads):
        history = train(config, data).history
    value, reached, _ = objective(history, target=float(config.target_accuracy))
    return value, reached


def measure(name: str, seeds: list[int], ds: Any, data: dict[str, Any],
            calibration: dict[str, Any]) -> Runs:
    """Configuration ``name`` trained on each seed as is and under each perturbation."""
    from tasks.grid import GridSettings

    runs: Runs = {kind: [] for kind in KINDS}
    for seed in seeds:
        settings = GridSettings(seed=seed, data_seed=0, mode="local")
        config = trial_run_config(settings, name, ds, calibration, to_budget=False)
        runs["as is"].append(objective_of(config, data["as is"], 1))
        runs["2 threads"].append(objective_of(config, data["as is"], 2))
        runs["one bit"].append(objective_of(config, data["one bit"], 1))
    return runs


def relative_differences(runs: Runs, kind: str) -> list[float]:
    return [abs(a - b) / ((a + b) / 2)
            for (a, _), (b, _) in zip(runs["as is"], runs[kind], strict=True)]


def print_config(name: str, seeds: list[int], runs: Runs, seconds: float) -> None:
    print(f"\n{name} ({seconds:.0f} s)")
    for i, seed in enumerate(seeds):
        cells = []
        for kind in KINDS:
            value, reached = runs[kind][i]
            diff = "" if kind == "as is" else \
                f" ({100 * relative_differences(runs, kind)[i]:.1f} %)"
            cells.append(f"{kind} {value:.4f}{'' if reached else ' missed'}{diff}")
        print(f"  seed {seed}: " + ";  ".join(cells))
    print(f"  seed CV (as is): {100 * cv([v for v, _ in runs['as is']]):.1f} %")


def spread(values: list[float]) -> str:
    return (f"{100 * min(values):.1f} / {100 * statistics.median(values):.1f} / "
            f"{100 * max(values):.1f} %")


def main(argv: list[str] | None = None) -> int:
    from models import load_dataset

    args, t0 = parse_args(argv), time.perf_counter()
    ds = load_dataset("mnist1d", seed=0)
    data = datasets(ds)
    calibrations = {m: calibration_for(m, ds, data["as is"])
                    for m in {CONFIGS[c][0] for c in args.configs}}
    print(f"network 16, local mode, seeds {args.seeds}: each training as is, with 2 threads, "
          "and with one input bit moved", flush=True)
    diffs: dict[str, list[float]] = {kind: [] for kind in KINDS[1:]}
    cvs = []
    for name in args.configs:
        start = time.perf_counter()
        runs = measure(name, args.seeds, ds, data, calibrations[CONFIGS[name][0]])
        print_config(name, args.seeds, runs, time.perf_counter() - start)
        for kind in diffs:
            diffs[kind] += relative_differences(runs, kind)
        cvs.append(cv([v for v, _ in runs["as is"]]))
    print()
    for kind, values in diffs.items():
        print(f"{kind}: the objective moved by min / median / max {spread(values)} over "
              f"{len(values)} trainings ({sum(v == 0 for v in values)} unchanged)")
    print(f"the seed: CV min / median / max {spread(cvs)} over {len(cvs)} configurations")
    print(f"\nwall time {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
