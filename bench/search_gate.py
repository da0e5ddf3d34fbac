"""Does the search's gate see the configurations the held-out stage answers with?

A search trial counts as reaching the target only if its one training seed (the grid's
``seed``) reaches the target plus the search margin within the search's epoch budget. A
held-out training of the same configuration counts if it reaches the bare target within
:data:`tasks.validation.HELD_OUT_EPOCHS` times that budget. This trains fixed configurations
on several training seeds, each once to the held-out budget (``local`` mode: the same math and
simulated time as on ranks; one compute calibration per model), and reads both gates from the
same history, per seed:

* **search gate**: the first evaluation at or above target + margin, at or before the search's
  last epoch (the trial's value, else ``-``);
* **held-out**: the first evaluation at or above the target (a held-out trial's value);
* the best test accuracy within the search's budget and within the held-out one.

It ends with each configuration's count of seeds passing each gate. A configuration that
passes the held-out gate on most seeds but the search's on about half of them is found or
missed by a search according to its one seed: two grids of different seeds then answer with
different configurations (issue 24's contradictions).

Run: ``nice -n 10 python bench/search_gate.py [--model cnn] [--algorithm padadamp]
[--params "rate=0.083;rate=0.16"] [--network 4] [--seeds 0,1,2,3,4,5,6,7] [--search-epochs 15]``
(a CNN training to 15 epochs takes about 4 s on this machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

History = list[dict[str, Any]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="cnn", help="mlp or cnn")
    parser.add_argument("--algorithm", default="padadamp", help="a damper of the grid")
    parser.add_argument("--params", default="rate=0.083;rate=0.16",
                        help="configurations, ';'-separated, each NAME=VALUE[,NAME=VALUE]")
    parser.add_argument("--network", type=int, default=4, help="the cell's network size")
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7", help="training seeds")
    parser.add_argument("--search-epochs", type=float, default=None,
                        help="the search's epoch budget (default: the grid's for the model)")
    args = parser.parse_args(argv)
    if args.model not in ("mlp", "cnn"):
        parser.error(f"--model: {args.model!r}; accepted: mlp, cnn")
    try:
        args.configs = [{k: float(v) for k, v in (p.split("=") for p in c.split(","))}
                        for c in args.params.split(";") if c]
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--params {args.params!r} / --seeds {args.seeds!r}; accepted: "
                     "NAME=VALUE[,NAME=VALUE][;...] and integers, comma-separated")
    if args.network < 1 or not args.configs:
        parser.error("--network: an integer >= 1; --params: at least one configuration")
    if args.search_epochs is not None and not args.search_epochs > 0:
        parser.error(f"--search-epochs: {args.search_epochs:g}; accepted: a number of epochs > 0")
    return args


def held_out_config(args: argparse.Namespace, params: dict[str, float], seed: int, ds: Any,
                    calibration: dict[str, Any]) -> tuple[Any, float, float]:
    """A held-out trial's engine configuration, trained past its target to the end of its
    budget (every evaluation kept, dense from the target less the margin on); its target and
    the search's epoch budget."""
    from objective_noise import past_the_target

    from damptune.trainer import with_calibration
    from tasks.grid import DEFAULT_EPOCHS, Cell, GridSettings
    from tasks.trial import trial_config
    from tasks.validation import HELD_OUT_EPOCHS

    search_epochs = args.search_epochs or DEFAULT_EPOCHS[args.model]
    settings = GridSettings(seed=seed, data_seed=0, mode="local",
                            epochs={args.model: search_epochs * HELD_OUT_EPOCHS})
    cell = Cell(args.network, args.algorithm, args.model, stage="validation")
    config = with_calibration(trial_config(settings, cell, dict(params), ds), calibration)
    target = config.target_accuracy
    assert target is not None  # a trial always stops at its model's target
    return past_the_target(config, below=settings.search_margin), target, search_epochs


def gates(history: History, *, target: float, margin: float,
          search_epochs: float) -> tuple[float | None, float | None, float, float]:
    """(search gate's time, held-out time, best accuracy in the search's budget, in all)."""
    evals = [r for r in history if r["kind"] == "eval"]
    early = [r for r in evals if r["epoch"] <= search_epochs + 1e-9]
    search = next((r["time_sim"] for r in early if r["test_accuracy"] >= target + margin - 1e-9),
                  None)
    held = next((r["time_sim"] for r in evals if r["test_accuracy"] >= target - 1e-9), None)
    return (search, held, max((r["test_accuracy"] for r in early), default=0.0),
            max((r["test_accuracy"] for r in evals), default=0.0))


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    import torch
    from objective_noise import calibration_for

    from damptune import TrainData, train
    from models import load_dataset
    from tasks.grid import GridSettings

    args, t0 = parse_args(argv), time.perf_counter()
    torch.set_num_threads(1)  # as a rank trains
    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    calibration = calibration_for(args.model, ds, data)
    margin = GridSettings().search_margin
    passed = []
    print(f"{args.model} {args.algorithm}, network {args.network}, seeds {args.seeds}, search "
          f"margin {margin}")
    print("| configuration | seed | search gate (s) | held-out (s) | best acc: search budget "
          "| held-out budget |\n|---|---|---|---|---|---|")
    for params in args.configs:
        counts = [0, 0]
        for seed in args.seeds:
            config, target, epochs = held_out_config(args, params, seed, ds, calibration)
            search, held, early, best = gates(train(config, data).history, target=target,
                                              margin=margin, search_epochs=epochs)
            counts[0] += search is not None
            counts[1] += held is not None
            print(f"| {params} | {seed} | {_cell(search)} | {_cell(held)} | {early:.3f} | "
                  f"{best:.3f} |", flush=True)
        passed.append((params, counts))
    print(f"\nseeds passing (of {len(args.seeds)}), target {target}, margin {margin}, search "
          f"budget {epochs:g} epochs, held-out budget {config.max_epochs:g}:")
    for params, (search_n, held_n) in passed:
        print(f"  {params}: search gate {search_n}, held-out {held_n}")
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
