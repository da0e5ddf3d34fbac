"""What a rank's forward/backward and an evaluation cost by how many examples go in one pass.

A grid trial trains on one single-threaded Dask worker (every rank's share of a batch in one
pass: ``micro_batch`` None) and evaluates on the 1,000 test examples in growing chunks
(``shard_evaluate``'s ``chunk`` 256: passes of 256, 256, 488). On a CPU the time per example
of these small models is not constant in the pass size: past some size the activations leave
the caches. This times, for the MLP and the CNN, one torch thread, random inputs of MNIST-1D's
shape (the values do not change the arithmetic's time):

- ``shard_forward`` with ``grad`` of a batch of 64–512 examples in one pass, and in
  micro-batches of 64, 128 and 256 (the same gradient sum, added up in another order);
- ``shard_evaluate`` of 1,000 examples with first chunks of 128, 256 (the engine's), 512, 1,000.

Each figure is the fastest of 5 repeats of ``--calls`` calls, in ms per call, with its ratio to
the engine's current choice. No goal: it says what a change of pass size would buy. A
micro-batch or a chunk other than today's adds the sums in another order, so it changes the
trials' values (``bench/rounding_noise.py``: up to 7 % for a CNN trial), not only their time.

Run: ``nice -n 10 python bench/kernel_shapes.py [--calls 100]`` (about a minute, machine idle).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from damptune.loop import shard_evaluate, shard_forward  # noqa: E402
from models import get_model  # noqa: E402

BATCHES = (64, 128, 256, 512)
MICRO = (64, 128, 256)
ENGINE_CHUNK: int = inspect.signature(shard_evaluate).parameters["chunk"].default
CHUNKS = tuple(sorted({128, ENGINE_CHUNK, 512, 1000}))


def fastest(call: Callable[[], object], calls: int) -> float:
    """ms per call: the fastest of 5 repeats of ``calls`` calls (after one warm-up call)."""
    call()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return min(times)


def forward_rows(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor,
                 calls: int) -> list[str]:
    rng = np.random.default_rng(0)
    lines = []
    for b in BATCHES:
        idx = rng.permutation(len(y))[:b]
        one = fastest(partial(shard_forward, model, X, y, idx, grad=True), calls)
        cells = [f"one pass {one:.3f}"]
        for mb in (m for m in MICRO if m < b):
            ms = fastest(partial(shard_forward, model, X, y, idx, grad=True, micro_batch=mb),
                         calls)
            cells.append(f"micro-batch {mb} {ms:.3f} ({ms / one:.2f}×)")
        lines.append(f"  forward/backward, batch {b}: " + ", ".join(cells))
    return lines


def evaluation_rows(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor,
                    calls: int) -> list[str]:
    rows = range(len(y))
    ms = {c: fastest(partial(shard_evaluate, model, X, y, rows, chunk=c), calls) for c in CHUNKS}
    return ["  evaluation of 1,000, first chunk: " + ", ".join(
        f"{c} {v:.3f} ({v / ms[ENGINE_CHUNK]:.2f}×)" for c, v in ms.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per repeat")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error(f"--calls: {args.calls} given; a positive integer is accepted")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    X, y = torch.randn(4000, 40), torch.randint(0, 10, (4000,))
    print(f"one torch thread; ms per call, the fastest of 5 repeats of {args.calls}; "
          f"ratios to one pass (forward/backward) and to the engine's chunk {ENGINE_CHUNK} "
          "(evaluation)")
    for name in ("mlp", "cnn"):
        model = get_model(name, input_shape=(40,), n_classes=10)
        print(name, flush=True)
        for line in forward_rows(model, X, y, args.calls):
            print(line, flush=True)
        for line in evaluation_rows(model, X[:1000], y[:1000], args.calls):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
