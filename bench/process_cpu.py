"""Where a job's CPU goes, by process role: Dask workers, the flow, the MLflow and Prefect servers.

It runs a command (``python bench/process_cpu.py -- make run``), or watches the machine until a
process exits (``--until PID``), and reads every process's CPU time (user + system, with
psutil) every ``--interval`` seconds. A process that exits keeps its last reading, so at most
one interval of its CPU is missed. At the end it prints each role's CPU seconds, its share of
all the CPU the roles used, and how busy the machine's cores were over the watch. It also reads
the machine's steal time (Linux, ``/proc/stat``): the time the hypervisor gave this virtual
machine's cores to others while they had work, which slows every process alike and no process's
CPU time shows.

Roles, by command line: ``dask workers`` (a local cluster's workers, forked from its
forkserver), ``flow process`` (the flow run a Prefect worker started: ``prefect.engine``, or
``damptune tune``), ``mlflow server``, ``prefect server``, ``prefect worker``, ``install``
(``pip install``), ``other python``.

Run: ``python bench/process_cpu.py [--interval 10] -- make run``.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from collections.abc import Callable

ROLES = (  # (role, words of its command line), the first match wins
    ("dask workers", ("multiprocessing.forkserver", "distributed.cli.dask_worker")),
    ("flow process", ("prefect.engine", "damptune tune", "damptune/__main__")),
    ("mlflow server", ("uvicorn", "mlflow server", "gunicorn")),
    ("prefect server", ("server start",)),
    ("prefect worker", ("worker start",)),
    ("install", ("pip install",)),
    ("other python", ("python",)),
)


def role_of(cmdline: str) -> str | None:
    return next((role for role, words in ROLES if any(w in cmdline for w in words)), None)


def read_all() -> dict[int, tuple[str, float]]:
    """{pid: (role, CPU seconds: user + system)} of the processes with a role."""
    import psutil

    out: dict[int, tuple[str, float]] = {}
    for proc in psutil.process_iter(["cmdline", "cpu_times"]):  # None where it was refused
        role, times = role_of(" ".join(proc.info["cmdline"] or [])), proc.info["cpu_times"]
        if role is not None and times is not None and proc.pid != os.getpid():  # not itself
            out[proc.pid] = (role, times.user + times.system)
    return out


def watch(done: Callable[[], bool], interval: float) -> tuple[dict[int, tuple[str, float]], float]:
    """The last CPU reading of every process seen, and the seconds watched."""
    seen: dict[int, tuple[str, float]] = {}
    start = time.monotonic()
    while True:
        seen.update(read_all())
        if done():
            return seen, time.monotonic() - start
        time.sleep(interval)


def steal_seconds() -> float:
    """The machine's steal time so far, summed over its cores (0 where the OS has none)."""
    import psutil

    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def steal_line(steal: float, core_seconds: float) -> str:
    return (f"steal: {steal:.0f} core-seconds, {100 * steal / max(core_seconds, 1e-9):.1f} % of "
            "the cores' time (taken by the hypervisor while this machine had work)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--until", type=int, help="watch until this process exits")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"]
    if bool(command) == bool(args.until):
        parser.error("give a command after --, or --until PID (not both)")
    before, steal_before = read_all(), steal_seconds()  # what already ran counts from here
    if command:
        proc = subprocess.Popen(command)
        seen, seconds = watch(lambda: proc.poll() is not None, args.interval)
    else:
        seen, seconds = watch(lambda: not os.path.exists(f"/proc/{args.until}"), args.interval)
    by_role: dict[str, float] = collections.defaultdict(float)
    for pid, (role, cpu) in seen.items():
        by_role[role] += cpu - before.get(pid, (role, 0.0))[1]
    total = sum(by_role.values())
    cores = os.cpu_count() or 1
    print(f"watched {seconds:.0f} s on {cores} cores: the roles used {total:.0f} CPU-seconds, "
          f"{100 * total / (seconds * cores):.1f} % of the machine")
    print(steal_line(steal_seconds() - steal_before, seconds * cores))
    print("| role | CPU seconds | share |\n|---|---|---|")
    for role, cpu in sorted(by_role.items(), key=lambda kv: -kv[1]):
        print(f"| {role} | {cpu:.0f} | {100 * cpu / max(total, 1e-9):.1f} % |")
    return proc.returncode if command else 0


if __name__ == "__main__":
    sys.exit(main())
