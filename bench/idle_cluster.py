"""How much CPU does an idle 16-worker local cluster burn: the flow's against Dask's defaults?

Both clusters are the flow's ``cluster="local"`` shape (single-threaded worker processes with
torch imported, the project's worker plugins registered), measured one after the other in the
same run: the baseline with Dask's default configuration, then the flow's own
(``damptune.cluster.local_cluster``, which applies ``QUIET_CONFIG``). After a settling pause,
the CPU seconds (user + system) of the worker processes and of this process (the scheduler, the
nannies and the client) are summed over ``--seconds`` of doing nothing.

Goal (issue 25): the flow's idle 16-worker cluster uses <= 1 % of one core in total.

Run: ``python bench/idle_cluster.py [--workers 16] [--seconds 60] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

GOAL_PERCENT = 1.0


def _cpu(proc: Any) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _idle_percent(cluster: Any, *, seconds: float, settle: float) -> tuple[float, float]:
    """(% of a core used by the workers, by this process) while ``cluster`` idles."""
    import psutil
    from distributed import Client

    from damptune import claims, membership
    from damptune.preemption import PreemptionPlugin

    with Client(cluster, set_as_default=False) as client:
        for plugin in (PreemptionPlugin(), membership.MembershipPlugin(), claims.ClaimsPlugin()):
            client.register_plugin(plugin)
        client.run(lambda: __import__("torch").__version__)  # what a rank's worker holds
        time.sleep(settle)
        me = psutil.Process()
        kids = me.children(recursive=True)
        start = {k.pid: _cpu(k) for k in kids}
        mine, t0 = _cpu(me), time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        workers = sum(_cpu(k) - start[k.pid] for k in kids if k.is_running())
        return 100 * workers / wall, 100 * (_cpu(me) - mine) / wall


def _measure(kind: str, *, n_workers: int, seconds: float, settle: float) -> tuple[float, float]:
    from distributed import LocalCluster

    from damptune.cluster import local_cluster

    scratch = tempfile.mkdtemp(prefix="damptune-idle-")
    if kind == "dask defaults":
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None,
                               local_directory=scratch, silence_logs=40)
    else:
        cluster = local_cluster(n_workers=n_workers, local_directory=scratch)
    try:
        return _idle_percent(cluster, seconds=seconds, settle=settle)
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0, help="idle time measured")
    parser.add_argument("--settle", type=float, default=10.0, help="pause before measuring")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows: dict[str, list[float]] = {}
    for kind in ("dask defaults", "damptune"):
        for _ in range(args.repeats):
            workers, main_proc = _measure(kind, n_workers=args.workers, seconds=args.seconds,
                                          settle=args.settle)
            rows.setdefault(kind, []).append(workers + main_proc)
            print(f"{kind:>14}: workers {workers:5.2f} % + scheduler/nannies {main_proc:5.2f} % "
                  f"of a core over {args.seconds:g} s", flush=True)
    base, ours = (statistics.median(rows[k]) for k in ("dask defaults", "damptune"))
    print(f"\n| cluster ({args.workers} idle workers) | % of one core, min / median / max |")
    print("|---|---|")
    for kind, values in rows.items():
        print(f"| {kind} | {min(values):.2f} / {statistics.median(values):.2f} / "
              f"{max(values):.2f} |")
    verdict = "met" if ours <= GOAL_PERCENT else "not met"
    print(f"\ndamptune / dask defaults: {ours / base:.3f} (median); goal <= {GOAL_PERCENT:g} % of "
          f"one core in total: {verdict} ({ours:.2f} %)")
    records.write("idle_cluster", goals={
        f"damptune's idle cluster <= {GOAL_PERCENT:g} % of one core": ours <= GOAL_PERCENT},
        figures={"damptune_percent": ours, "dask_defaults_percent": base},
        workers=args.workers, seconds=args.seconds, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
