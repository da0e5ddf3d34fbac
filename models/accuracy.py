"""Check that the CPU models learn MNIST-1D: plain single-process SGD, test accuracy printed.

Run ``python -m models.accuracy`` (``--help`` for the settings). This is a sanity check of the
models and the data, independent of the engine: the MNIST-1D paper reports ≈68 % for the MLP
and ≈94 % for the CNN.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from torch import nn

from models.datasets import DATASETS, Dataset, load_dataset
from models.registry import get_model

__all__ = ["evaluate", "main", "train"]


def evaluate(model: nn.Module, X: np.ndarray, y: np.ndarray, *, batch_size: int = 1000) -> float:
    """Return the accuracy (fraction in ``[0, 1]``) of ``model`` on the arrays ``X``, ``y``."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch_size):
            logits = model(torch.from_numpy(X[i : i + batch_size]))
            correct += int((logits.argmax(1) == torch.from_numpy(y[i : i + batch_size])).sum())
    return correct / len(y)


def train(
    model: nn.Module,
    data: Dataset,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    seed: int = 0,
) -> float:
    """Train ``model`` with SGD and a cosine learning-rate decay; return its test accuracy.

    Args:
        model: The model to train in place.
        data: Train and test arrays.
        epochs: Passes over the training set.
        lr: Peak learning rate, decayed to 0 along a cosine over all updates.
        batch_size: Examples per update.
        momentum: SGD momentum.
        weight_decay: L2 penalty of SGD.
        seed: Seed of the shuffling.

    Returns:
        Test accuracy after the last epoch, in ``[0, 1]``.
    """
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(data.y_train) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: 0.5 * (1 + math.cos(math.pi * step / (epochs * steps_per_epoch)))
    )
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    gen = torch.Generator().manual_seed(seed)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(y), generator=gen).split(batch_size):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(X[idx]), y[idx]).backward()
            opt.step()
            sched.step()
    return evaluate(model, data.X_test, data.y_test)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train each requested model on a dataset (mnist1d by default); print its test accuracy.

    Args:
        argv: Command-line arguments (None reads ``sys.argv``).

    Returns:
        Test accuracy by model name.
    """
    parser = argparse.ArgumentParser(prog="python -m models.accuracy", description=__doc__)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], help="model names")
    parser.add_argument("--dataset", default="mnist1d", choices=DATASETS, help="dataset name")
    parser.add_argument("--epochs", type=int, default=100, help="passes over the training set")
    parser.add_argument("--lr", type=float, default=0.05, help="peak learning rate (cosine)")
    parser.add_argument("--batch-size", type=int, default=100, help="examples per update")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="SGD L2 penalty")
    parser.add_argument("--seed", type=int, default=0, help="data, init and shuffling seed")
    parser.add_argument("--n-samples", type=int, default=None, help="dataset size (train+test)")
    parser.add_argument("--root", default=None, help="cifar10 directory (nothing is downloaded)")
    args = parser.parse_args(argv)

    data = load_dataset(args.dataset, seed=args.seed, root=args.root, n_samples=args.n_samples)
    print(
        f"{args.dataset}: {len(data.y_train)} train / {len(data.y_test)} test; SGD momentum 0.9, "
        f"lr {args.lr} (cosine), batch {args.batch_size}, {args.epochs} epochs, "
        f"weight decay {args.weight_decay}, seed {args.seed}"
    )
    results: dict[str, float] = {}
    for name in args.models:
        torch.manual_seed(args.seed)
        model = get_model(name, input_shape=data.input_shape, n_classes=data.n_classes)
        n_params = sum(p.numel() for p in model.parameters())
        start = time.perf_counter()
        acc = train(
            model,
            data,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            weight_decay=args.weight_decay,
            seed=args.seed,
        )
        results[name] = acc
        print(
            f"{name:>4}: test accuracy {100 * acc:5.1f} %  "
            f"({n_params} parameters, {time.perf_counter() - start:.1f} s)"
        )
    return results


if __name__ == "__main__":
    main()
