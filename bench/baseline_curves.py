"""Where the default grid's targets come from: the single-process baseline's test accuracy
over each model's budget.

The baseline is plain SGD at the grid's initial batch (32 examples, lr 0.05, momentum 0.9,
``sgd``: no damping), trained in ``local`` mode for the model's default budget
(``tasks.grid.DEFAULT_EPOCHS``), evaluated every half epoch. Its accuracy at 90 % of the
budget (the mean of the evaluations between 85 % and 95 %, as test accuracy is noisy) is the
candidate target: near the plateau the budget reaches, where the damping of the batch size
matters (the late phase of training), and reachable by a schedule within the budget. It
prints the curve, that figure and the default target of ``tasks.grid.DEFAULT_TARGETS``.

Run: ``python bench/baseline_curves.py [--models mlp,cnn] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def curve(model: str, epochs: float, seed: int) -> list[tuple[float, float]]:
    """(epoch, test accuracy) every half epoch of the baseline."""
    from damptune import TrainConfig, TrainData, train
    from damptune.config import import_path
    from models import load_dataset, model_class

    ds = load_dataset("mnist1d", seed=seed)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    config = TrainConfig(
        module=import_path(model_class(model)),
        module_kwargs={"input_shape": tuple(ds.input_shape), "n_classes": int(ds.n_classes)},
        optimizer_kwargs={"momentum": 0.9}, lr=0.05, damper="sgd",
        damper_kwargs={"initial": 32}, max_batch_size=32, per_worker_batch=32, max_workers=1,
        max_epochs=epochs, eval_every=0.5, seed=seed, mode="local",
        compute_per_example=1e-5, compute_fixed=1e-4)  # the clock is not what is measured
    state = train(config, data)
    return [(r["epoch"], r["test_accuracy"]) for r in state.history if r["kind"] == "eval"]


def main(argv: list[str] | None = None) -> int:
    from tasks.grid import DEFAULT_EPOCHS, DEFAULT_TARGETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for model in args.models.split(","):
        budget = DEFAULT_EPOCHS[model]
        points = curve(model, budget, args.seed)
        late = [a for e, a in points if 0.85 * budget <= e <= 0.95 * budget]
        at_90 = statistics.mean(late)
        print(f"{model}: budget {budget:g} epochs; test accuracy every half epoch:")
        print("  " + " ".join(f"{e:.1f}:{a:.3f}" for e, a in points))
        print(f"  at 90 % of the budget (mean of epochs {0.85 * budget:g}-{0.95 * budget:g}): "
              f"{at_90:.3f}; best {max(a for _, a in points):.3f}; default target "
              f"{DEFAULT_TARGETS[model]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
