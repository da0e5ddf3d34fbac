"""How many cores this machine really gives: one busy process against N at once.

Every figure of the grid's wall time assumes the machine's cores run in parallel. On a
virtual machine two vCPUs may share a physical core, or a host may be busy, and the same code
then takes longer for no reason in the code. This measures it, in the same run: a fixed
single-threaded workload (a torch MLP forward+backward loop, the grid's own kind of work, one
torch thread) timed alone, then in ``--procs`` processes at once (default: every core). The
effective cores are ``procs × alone / together``; on an idle machine whose cores are its own,
they equal ``procs``.

Run: ``python bench/machine_parallelism.py [--procs 2] [--seconds 5] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from typing import Any


def _work(steps: int, barrier: Any = None, out: Any = None) -> float:
    """Wall seconds of ``steps`` MLP forward+backward passes on 32 examples, one thread;
    with a ``barrier``, started when every process is ready, and put on ``out``."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    x, y = torch.randn(32, 40), torch.randint(0, 10, (32,))
    if barrier is not None:
        barrier.wait()
    t0 = time.perf_counter()
    for _ in range(steps):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
    seconds = time.perf_counter() - t0
    if out is not None:
        out.put(seconds)
    return seconds


def _at_once(ctx: Any, procs: int, steps: int) -> float:
    """The slowest of ``procs`` processes running the workload together."""
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_work, args=(steps, barrier, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    times = [out.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    return max(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one workload")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    probe = 200
    steps = max(probe, int(probe * args.seconds / _at_once(ctx, 1, probe)))
    cores = []
    for _ in range(args.repeats):
        alone = _at_once(ctx, 1, steps)
        together = _at_once(ctx, args.procs, steps)
        cores.append(args.procs * alone / together)
        print(f"alone {alone:.2f} s, {args.procs} at once {together:.2f} s: "
              f"{cores[-1]:.2f} effective cores")
    print(f"effective cores, min / median / max of {args.repeats}: {min(cores):.2f} / "
          f"{statistics.median(cores):.2f} / {max(cores):.2f} (of {args.procs} asked for; "
          f"{os.cpu_count()} reported)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
