"""What does starting a local cluster cost, until every worker has taken one optimizer step?

Each measurement runs in a fresh Python process (as a flow run or ``damptune tune`` does): it
starts a LocalCluster of ``--workers`` single-threaded worker processes, runs on every worker
what a rank's first update needs (the engine imported, one ``torch.optim.SGD`` step, whose
first call imports ``torch._dynamo``), and reports the wall seconds to that point and the CPU
seconds of the whole process tree (this process, the workers, a forkserver). Two ways of
starting the workers, alternated in the same run:

- ``spawn``: Dask's default, every worker a fresh interpreter;
- ``forkserver``: ``damptune.cluster.local_cluster``, workers forked from one server process
  that imported torch, torch._dynamo and the engine once.

Two more rows start ``forkserver`` workers from a process whose main module imports
``prefect.engine``, as a flow run of Prefect's process worker (``python -m prefect.engine``)
does: multiprocessing runs the main module again in each worker. ``main by path`` runs this
file as a script (its imports run again in every worker, as a flow run's did before the
forkserver imported the main module); ``main by name`` runs it as ``python -m
bench.cluster_start``, which ``local_cluster`` has the forkserver import once.

Goals (issue 25: the grid at the machine's floor): the flow's cluster start costs at most half
the CPU of Dask's default; a main module run by name costs its workers at most half the CPU
it costs run by path.

Run: ``python bench/cluster_start.py [--workers 4] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import records  # noqa: E402

MAIN_IMPORTS = "DAMPTUNE_BENCH_MAIN_IMPORTS"
if os.environ.get(MAIN_IMPORTS):  # what a flow run's main module imports: all of Prefect
    importlib.import_module(os.environ[MAIN_IMPORTS])

GOAL = 0.5  # forkserver CPU / spawn CPU; main by name / main by path
METHODS = ("spawn", "forkserver", "main by path", "main by name")


def _first_step() -> bool:
    import torch

    import damptune.ranks  # noqa: F401 - what a rank's task imports

    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 8)).sum().backward()
    optimizer.step()
    return True


def _tree_cpu() -> float:
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def _one(method: str, n_workers: int) -> dict[str, float]:
    """In this (fresh) process: start the cluster, one step per worker; wall and CPU."""
    import dask
    from distributed import Client, LocalCluster

    from damptune.cluster import QUIET_CONFIG, local_cluster

    t0, cpu0 = time.monotonic(), _tree_cpu()
    scratch = tempfile.mkdtemp(prefix="damptune-start-")
    if method == "forkserver":
        cluster = local_cluster(n_workers=n_workers, local_directory=scratch)
    else:
        with dask.config.set(QUIET_CONFIG):
            cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=None,
                                   local_directory=scratch, silence_logs=40)
    with Client(cluster, set_as_default=False) as client:
        done = client.run(_first_step)
        wall, cpu = time.monotonic() - t0, _tree_cpu() - cpu0
    cluster.close()
    assert len(done) == n_workers and all(done.values()), done
    return {"wall": wall, "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=("spawn", "forkserver"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args.workers)))
        return 0
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for _ in range(args.repeats):
        for method in METHODS:  # alternated: machine load hits both alike
            out = subprocess.run(_command(method, args.workers), capture_output=True,
                                 text=True, check=True, cwd=REPO, env=_environ(method))
            rows[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{method:>10}: {rows[method][-1]}", flush=True)
    print(f"\n| {args.workers} workers, start to one step each | wall s, min / median / max "
          "| CPU s of the process tree, min / median / max |")
    print("|---|---|---|")
    for method, values in rows.items():
        walls, cpus = ([v[k] for v in values] for k in ("wall", "cpu"))
        print(f"| {method} | {min(walls):.1f} / {statistics.median(walls):.1f} / "
              f"{max(walls):.1f} | {min(cpus):.1f} / {statistics.median(cpus):.1f} / "
              f"{max(cpus):.1f} |")
    cpu = {m: statistics.median(v["cpu"] for v in rows[m]) for m in METHODS}
    goals, figures = {}, {}
    for new, old in (("forkserver", "spawn"), ("main by name", "main by path")):
        ratio = cpu[new] / cpu[old]
        print(f"\n{new} / {old} CPU: {ratio:.2f} (median); goal <= {GOAL:g}: "
              f"{'met' if ratio <= GOAL else 'not met'}")
        goals[f"{new} <= {GOAL:g} of {old}'s CPU"] = ratio <= GOAL
        figures[f"{new} / {old} CPU"] = ratio
    for method in METHODS:
        figures[f"{method} cpu_s"] = cpu[method]
        figures[f"{method} wall_s"] = statistics.median(v["wall"] for v in rows[method])
    records.write("cluster_start", figures=figures, goals=goals, workers=args.workers,
                  repeats=args.repeats)
    return 0


def _command(method: str, n_workers: int) -> list[str]:
    main = ["-m", "bench.cluster_start"] if method == "main by name" else [__file__]
    way = "spawn" if method == "spawn" else "forkserver"
    return [sys.executable, *main, "--one", way, "--workers", str(n_workers)]


def _environ(method: str) -> dict[str, str]:
    if method.startswith("main by"):
        return {**os.environ, MAIN_IMPORTS: "prefect.engine"}
    return {k: v for k, v in os.environ.items() if k != MAIN_IMPORTS}


if __name__ == "__main__":
    sys.exit(main())
