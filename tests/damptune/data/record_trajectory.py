"""Record the training trajectory that ``tests/damptune/test_damper_reference.py`` replays.

The default MLP (``models`` registry ``"mlp"``) on MNIST-1D (seed 0), plain SGD: batch 32,
lr 0.05, momentum 0.9, ``UPDATES`` updates, in this one process (plain torch, no Dask). Writes
``trajectory.json`` next to this file: one row per update ``k`` (0-based, as
``Progress.update``) with what the engine would know about it::

    update         k: the number of updates done before this one
    epoch          examples_seen / n_train, before the update
    examples_seen  examples used by the updates before this one
    loss           this update's batch loss (mean cross-entropy over its 32 examples)
    grad_sq_norm   squared L2 norm of this update's batch gradient (the mean over the batch)
    train_loss     every TRAIN_LOSS_EVERY updates: mean loss on a fixed 512-example training
                   subset at the weights before the update (what AdaDamp's F(w_k) evaluates)

Floats are rounded to 6 significant digits. Run: ``.venv/bin/python
tests/damptune/data/record_trajectory.py`` from the repository root (about 2 s of CPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from models.datasets import load_dataset  # noqa: E402
from models.registry import get_model  # noqa: E402

OUT = Path(__file__).with_name("trajectory.json")
UPDATES, BATCH, LR, MOMENTUM = 400, 32, 0.05, 0.9
TRAIN_LOSS_EVERY, TRAIN_LOSS_EXAMPLES, SEED = 10, 512, 0


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def record() -> tuple[dict[str, object], list[dict[str, float | int]]]:
    """Train; return the meta data and one row per update."""
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    data = load_dataset("mnist1d", seed=SEED)
    X, y = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    n_train = len(y)
    rng = np.random.default_rng(SEED)
    subset = torch.from_numpy(rng.permutation(n_train)[:TRAIN_LOSS_EXAMPLES])
    model = get_model("mlp", input_shape=data.input_shape, n_classes=data.n_classes)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    order, pos, seen, rows = rng.permutation(n_train), 0, 0, []
    for k in range(UPDATES):
        row: dict[str, float | int] = {"update": k, "epoch": _sig(seen / n_train),
                                       "examples_seen": seen}
        if k % TRAIN_LOSS_EVERY == 0:
            with torch.no_grad():
                row["train_loss"] = _sig(float(F.cross_entropy(model(X[subset]), y[subset])))
        if pos + BATCH > n_train:  # a new epoch: a fresh permutation, as the engine's sampler
            order, pos = rng.permutation(n_train), 0
        idx = torch.from_numpy(order[pos:pos + BATCH])
        pos += BATCH
        opt.zero_grad()
        loss = F.cross_entropy(model(X[idx]), y[idx])
        loss.backward()
        grad_sq = sum(float(p.grad.square().sum()) for p in model.parameters())
        opt.step()
        seen += BATCH
        row["loss"], row["grad_sq_norm"] = _sig(loss.item()), _sig(grad_sq)
        rows.append(row)
    meta = {"model": "mlp", "dataset": "mnist1d", "seed": SEED, "n_train": n_train,
            "batch_size": BATCH, "lr": LR, "momentum": MOMENTUM,
            "train_loss_examples": TRAIN_LOSS_EXAMPLES, "train_loss_every": TRAIN_LOSS_EVERY,
            "torch": torch.__version__}
    return meta, rows


def main() -> None:
    meta, updates = record()
    rows = [json.dumps(r, separators=(",", ":")) for r in updates]
    text = ('{"meta": ' + json.dumps(meta, sort_keys=True)
            + ',\n "updates": [\n' + ",\n".join(rows) + "\n]}\n")
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text)} bytes, {len(rows)} updates)")


if __name__ == "__main__":
    main()
