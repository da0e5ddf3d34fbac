"""How long is an update of damptune's two data-parallel modes against plain PyTorch DDP?

Same model, same data, same global batch, same P, same machine, same run. Baseline: DDP
(gloo, one process per rank, spawned by torch.multiprocessing). For damptune the median of the
per-update ``time_update`` records is reported, and the *amortized* time per update
(wall-clock difference between a long and a short run / extra updates), which also counts the
Dask round trips between segments.

A last column gives the cost of a change of P in each mode, in units of one update: a run whose
geometric damping doubles the batch after one epoch, from B/2 on P/2 ranks to B on P
(``bench/resizes.py`` measures it on the ranks).

Run: ``python bench/step_time.py`` (``--help`` for sizes). Prints a table with ratios to DDP
and a weak-scaling table (batch k·B on k·P ranks vs B on P). ``--device cuda``: every rank on
its own GPU (rank r on ``cuda:r``), DDP over NCCL, damptune with ``device="cuda"``; ``--ranks``
at most the GPUs there are.

Goals (median over P and both scalings): decentralized <= 1.10x DDP, centralized <= 1.5x DDP;
a change of P <= 2 updates.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records, resizes  # noqa: E402
from damptune import TrainConfig, TrainData, train  # noqa: E402
from damptune.cluster import local_cluster  # noqa: E402
from models import load_dataset  # noqa: E402

MODULE = "models.mlp:MLP"


def module_kwargs(args: argparse.Namespace, input_shape: tuple[int, ...]) -> dict:
    return {"input_shape": input_shape, "n_classes": 10, "hidden": args.hidden, "depth": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(rank, world, port, X, y, kwargs, batch, steps, warmup, out, device="cpu"):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from damptune.config import resolve

    torch.set_num_threads(1)
    cuda = device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    torch.manual_seed(0)
    where = torch.device(f"cuda:{rank}" if cuda else "cpu")
    X, y = X.to(where), y.to(where)
    model = DDP(resolve(MODULE)(**kwargs).to(where), device_ids=[rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    times = []
    for step in range(warmup + steps):
        idx = np.array_split(rng.choice(len(y), batch, replace=False), world)[rank]
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(X[idx]), y[idx], reduction="sum") / batch
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize(where)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def ddp_step_time(args, data: TrainData, kwargs: dict, world: int, batch: int) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_ddp_rank, args=(r, world, port, data.X, data.y, kwargs, batch,
                                                 args.steps, args.warmup, out, args.device))
             for r in range(world)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return result


def damptune_step_time(args, data, kwargs, mode, world, batch, scheduler):
    def run(updates: int) -> tuple[float, list[float]]:
        cfg = TrainConfig(
            module=MODULE, module_kwargs=kwargs, optimizer_kwargs={"momentum": 0.9}, lr=0.01,
            damper="sgd", damper_kwargs={"initial": batch}, max_batch_size=batch,
            per_worker_batch=max(1, batch // world), min_workers=world, max_workers=world,
            max_epochs=1e6, max_updates=updates, eval_every=1e6, mode=mode,
            device=args.device,
        )
        t0 = time.perf_counter()
        state = train(cfg, data, cluster=scheduler)
        wall = time.perf_counter() - t0
        times = [r["time_update"] for r in state.history if r["kind"] == "update"]
        return wall, times

    run(args.warmup)  # warm the workers (imports, group formation paths)
    short_wall, _ = run(args.warmup)
    long_wall, times = run(args.warmup + args.steps)
    median = statistics.median(times[args.warmup:])
    amortized = (long_wall - short_wall) / args.steps
    return median, amortized


def change_cost(data, kwargs, mode, world, batch, scheduler, device="cpu") -> float:
    """One change of P (world/2 -> world ranks, batch/2 -> batch), in updates."""
    from distributed import Client

    if world < 2:
        return float("nan")
    cfg = TrainConfig(
        module=MODULE, module_kwargs=kwargs, optimizer_kwargs={"momentum": 0.9}, lr=0.01,
        damper="geodamp", damper_kwargs={"initial": batch // 2, "factor": 2, "delay": 1},
        max_batch_size=batch, per_worker_batch=max(1, batch // world), min_workers=1,
        max_workers=world, max_epochs=1.5, eval_every=1e6, mode=mode, device=device,
    )
    with Client(scheduler, timeout="10s") as client:
        resizes.clear(client)
        state = train(cfg, data, cluster=scheduler)
        costs = resizes.change_costs(state.history, resizes.control_seconds(client))
    return statistics.median(costs) if costs else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512, help="MLP width")
    parser.add_argument("--batch", type=int, default=256, help="global batch (strong scaling)")
    parser.add_argument("--weak-batch", type=int, default=128, help="batch per P=1 (weak)")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: a GPU per rank, DDP over NCCL")
    args = parser.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]

    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train)
    kwargs = module_kwargs(args, ds.input_shape)
    n_params = sum(p.numel() for p in __import__("damptune").state.build_model(
        TrainConfig(module=MODULE, module_kwargs=kwargs)).parameters())
    print(f"MLP hidden={args.hidden}: {n_params} parameters; {os.cpu_count()} cores; "
          f"torch {torch.__version__}; device {args.device}; median of {args.steps} steps after "
          f"{args.warmup} warm-up")

    cluster = local_cluster(n_workers=max(ranks), local_directory="runs/bench-dask")
    try:
        rows = []
        for label, batch_of in (("strong", lambda p: args.batch),
                                ("weak", lambda p: args.weak_batch * p)):
            for p in ranks:
                batch = batch_of(p)
                ddp = ddp_step_time(args, data, kwargs, p, batch)
                address = cluster.scheduler_address
                dec = damptune_step_time(args, data, kwargs, "decentralized", p, batch, address)
                cen = damptune_step_time(args, data, kwargs, "centralized", p, batch, address)
                resize = tuple(change_cost(data, kwargs, mode, p, batch, address, args.device)
                               for mode in ("decentralized", "centralized"))
                rows.append((label, p, batch, ddp, dec, cen, resize))
                print(f"  measured {label} P={p} B={batch}", file=sys.stderr, flush=True)
    finally:
        cluster.close()

    print()
    print("| scaling | P | batch | DDP ms | decentral ms | ratio | amortized ratio |"
          " central ms | ratio | amortized ratio | change of P, updates (dec; cen) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, p, batch, ddp, (dm, da), (cm, ca), (rd, rc) in rows:
        print(f"| {label} | {p} | {batch} | {ddp * 1e3:.2f} | {dm * 1e3:.2f} | {dm / ddp:.2f}x |"
              f" {da / ddp:.2f}x | {cm * 1e3:.2f} | {cm / ddp:.2f}x | {ca / ddp:.2f}x |"
              f" {rd:.1f}; {rc:.1f} |")
    print()
    print("Weak scaling (step time at P / step time at P=1, batch grows with P; 1.00 = ideal):")
    weak = [r for r in rows if r[0] == "weak"]
    base = weak[0]
    for _, p, batch, ddp, (dm, _da), (cm, _ca), _ in weak:
        print(f"  P={p} B={batch}: DDP {ddp / base[3]:.2f}  decentralized {dm / base[4][0]:.2f}"
              f"  centralized {cm / base[5][0]:.2f}")
    print()
    dec = statistics.median(r[4][0] / r[3] for r in rows)
    cen = statistics.median(r[5][0] / r[3] for r in rows)
    changes = [c for r in rows for c in r[6] if c == c]
    change = statistics.median(changes) if changes else float("nan")
    goals = {}
    for name, value, goal in (("decentralized / DDP", dec, 1.10), ("centralized / DDP", cen, 1.5),
                              ("change of P, updates", change, 2.0)):
        print_goal(name, value, goal)
        goals[f"{name}, median <= {goal}"] = None if value != value else value <= goal
    figures = {"decentralized_over_ddp": dec, "centralized_over_ddp": cen,
               "change_of_p_updates": change}
    for label, p, _batch, ddp, (dm, _da), (cm, _ca), _ in rows:
        figures[f"{label}_p{p}_ms"] = {"ddp": ddp * 1e3, "decentralized": dm * 1e3,
                                       "centralized": cm * 1e3}
    records.write("step_time", figures=figures, goals=goals, device=args.device)
    return 0


def print_goal(name: str, value: float, goal: float) -> None:
    if value != value:  # nan: no run had P >= 2 (one GPU), so no change of P was made
        print(f"Goal: {name} <= {goal}: not measured (needs --ranks with a P of 2 or more)")
        return
    verdict = "met" if value <= goal else "not met"
    print(f"Goal: {name}, median {value:.2f} <= {goal}: {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
