"""Where the flow process's CPU goes, per trial: a py-spy profile grouped by component.

The flow process (the Prefect flow run, or ``damptune tune``) drives every trial: it asks and
tells Optuna, runs the Prefect task engine, logs to MLflow, draws plots, and hosts the Dask
client and scheduler. ``bench/process_cpu.py`` says how much CPU it takes; this says on what.

``--attach`` waits for the flow process to start (a command line with ``prefect.engine`` or
``damptune tune``, as :mod:`bench.process_cpu` tells the roles apart) and records it with
py-spy until it exits (``py-spy record --format raw``; py-spy is not a dependency of damptune:
``pip install py-spy`` into any environment and pass ``--py-spy``). Without it, it reads a raw
profile already recorded (``--raw``). Samples whose innermost frame waits (a selector, a
condition, a queue) are idle and left out; the rest ("busy": on a core, or blocked in a call
that does I/O, such as a SQLite commit or a socket, whose share it prints) are grouped by the
first component their stack reaches, in this order: plots (matplotlib), the Optuna sampler,
the rest of Optuna (storage, reports, ask and tell), MLflow's client, checkpoints, Dask
(client, scheduler), torch, imports, then the Prefect engine or damptune's own code,
whichever is innermost.

With ``--run-dir`` it divides by the grid's trials (every study in its Optuna storage) and
prints the flow process's milliseconds of busy samples per trial for each component.

With ``--workers`` it profiles the Dask workers instead, which train the trials' ranks:
py-spy follows the flow process's subprocesses (``--subprocesses``), and only the samples of
processes whose command line is a Dask worker's (:func:`process_cpu.role_of`) are kept, grouped
by what the rank does: joining a group (``rank_setup``), leaving it, resizes, rank checkpoints,
evaluation, the damper's loss on its subset, collectives, optimizer steps, forward and backward
passes, the rest of damptune's loop, and Dask's own work (tasks, comms, serialization).

Run, beside a ``make run`` of a fresh clone (from that clone):
``python bench/flow_profile.py --attach --py-spy PATH --out flow.raw --run-dir runs/grid``
(add ``--workers`` for the workers).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from process_cpu import read_all, role_of  # noqa: E402 - the roles of bench/process_cpu.py

IDLE = re.compile(r"^(EpollSelector\.select|_PollLikeSelector\.select|select|Condition\.wait|"
                  r"Event\.wait|Queue\.get|get|join|_worker|sleep|wait|poll)$")
GROUPS = (  # (component, words of a frame), the first that any frame of the stack has wins
    ("plots (matplotlib)", ("matplotlib",)),
    ("Optuna sampler (GP, TPE)", ("sample_relative", "sample_independent")),
    ("Optuna storage, reports, ask and tell", ("optuna/",)),
    ("MLflow client", ("mlflow/",)),
    ("checkpoints", ("damptune/checkpoint.py",)),
    ("Dask client and scheduler", ("distributed/", "dask/")),
    ("torch (the driver's state)", ("torch/",)),
    ("imports", ("_find_and_load",)),
)
WORKER_GROUPS = (  # the same, for a Dask worker's samples (the first match wins)
    ("joining a group (rank_setup)", ("rank_setup (",)),
    ("leaving a group", ("rank_teardown (", "_abort (")),
    ("resizes (P changes)", ("_control (", "_activate (")),
    ("rank checkpoints", ("rank_checkpoint", "damptune/checkpoint.py")),
    ("evaluation", ("shard_evaluate (", "evaluate_all (")),
    ("the damper's loss on its subset", ("RankOps.loss (", "_damper_loss (")),
    ("collectives (gloo)", ("_all_reduce (", "_sum_to_root (", "torch/distributed/")),
    ("optimizer step", ("optimizer_step (",)),
    ("forward and backward", ("shard_forward (",)),
    ("the rest of damptune's loop", ("damptune/", "models/")),
    ("Dask worker (tasks, comms, serialization)", ("distributed/", "tornado/", "asyncio/")),
    ("imports", ("_find_and_load",)),
)
IO = re.compile(r"^(DefaultDialect\.do_commit|SocketIO\.readinto|HTTPConnection\.send|"
                r"IOStream\.write_to_fd|_SelectorSocketTransport\.write|write|read|recv|send)$")
OWN = re.compile(r"\((tasks|damptune|flows|models|infra)/")
RATE = 25  # samples per second


def group_of(frames: list[str], groups: tuple[tuple[str, tuple[str, ...]], ...] = GROUPS
             ) -> str:
    """The component one sampled stack (root first) belongs to."""
    for name, words in groups:
        if any(w in f for f in frames for w in words):
            return name
    if groups is WORKER_GROUPS:
        return "other"
    for frame in reversed(frames):  # the innermost of the Prefect engine and our own code
        if "prefect/" in frame:
            return "Prefect task engine and client"
        if OWN.search(frame):
            return "damptune's own code"
    return "other"


def is_worker(frames: list[str]) -> bool:
    """Whether a sample (recorded with --subprocesses) is of a Dask worker: the innermost
    ``process PID:"command line"`` frame py-spy puts at its root names one."""
    procs = [f for f in frames if f.startswith("process ")]
    return bool(procs) and role_of(procs[-1]) == "dask workers"


def summarize(raw_path: str, *, workers: bool = False
              ) -> tuple[collections.Counter[str], int, int]:
    """Busy samples per component, the idle samples left out, and the busy ones in I/O; with
    ``workers``, of the Dask workers' samples only, else of the rest (the flow process; a
    profile recorded without ``--subprocesses`` has nothing else)."""
    busy: collections.Counter[str] = collections.Counter()
    idle = in_io = 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if not stack or is_worker(frames) != workers:  # the other side's samples
                continue
            leaf = frames[-1].split(" (")[0]
            if IDLE.match(leaf):
                idle += int(count)
                continue
            busy[group_of(frames, WORKER_GROUPS if workers else GROUPS)] += int(count)
            in_io += int(count) if IO.match(leaf) else 0
    return busy, idle, in_io


def trials_in(run_dir: str) -> int:
    """Every trial of every study in the grid's Optuna storage."""
    with sqlite3.connect(f"file:{run_dir}/optuna.db?mode=ro", uri=True) as db:
        return int(db.execute("SELECT COUNT(*) FROM trials").fetchone()[0])


def find_flow(timeout: float) -> int:
    """The pid of the flow process, once one runs (waits up to ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        flows = [pid for pid, (role, _) in read_all().items() if role == "flow process"]
        if flows:
            return flows[0]
        time.sleep(1.0)
    raise SystemExit(f"--attach: no flow process (prefect.engine, damptune tune) within "
                     f"{timeout:.0f} s")


def record(py_spy: str, out: str, timeout: float, *, workers: bool = False) -> None:
    if shutil.which(py_spy) is None:
        raise SystemExit(f"--py-spy: {py_spy!r} is not an executable; give the path of a py-spy "
                         "executable (`pip install py-spy` into any environment)")
    pid = find_flow(timeout)
    what = "and its subprocesses " if workers else ""
    print(f"recording the flow process {pid} {what}with py-spy ({RATE} Hz) into {out}",
          flush=True)
    subprocess.run([py_spy, "record", "-p", str(pid), "-r", str(RATE), "-f", "raw", "-o", out,
                    "--nonblocking", *(["--subprocesses"] if workers else [])], check=True)


def report(busy: collections.Counter[str], idle: int, in_io: int, trials: int | None) -> None:
    total = sum(busy.values())
    per = f", {trials} trials" if trials else ""
    print(f"{total / RATE:.0f} s of busy samples, {in_io / RATE:.0f} s of them in I/O calls "
          f"({idle / RATE:.0f} s idle left out){per}")
    head = "| component | share | ms per trial |" if trials else "| component | share |"
    print(head + "\n|---|---|" + ("---|" if trials else ""))
    for name, n in busy.most_common():
        row = f"| {name} | {100 * n / max(total, 1):.1f} % |"
        print(row + (f" {1000 * n / RATE / trials:.0f} |" if trials else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", help="a py-spy raw profile, recorded at 25 Hz, to read "
                        "(without --attach)")
    parser.add_argument("--attach", action="store_true", help="record the flow process")
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    parser.add_argument("--out", default="flow.raw", help="where --attach writes its profile")
    parser.add_argument("--wait", type=float, default=900.0,
                        help="--attach: seconds to wait for the flow process to start")
    parser.add_argument("--run-dir", help="the grid's run directory: per-trial figures")
    parser.add_argument("--workers", action="store_true", help="the Dask workers' samples "
                        "instead of the flow process's (--attach records its subprocesses)")
    args = parser.parse_args(argv)
    if bool(args.attach) == bool(args.raw):
        parser.error("give --attach or --raw FILE (one of them)")
    if args.attach:
        record(args.py_spy, args.out, args.wait, workers=args.workers)
    busy, idle, in_io = summarize(args.out if args.attach else args.raw, workers=args.workers)
    if args.workers and not busy + collections.Counter(idle=idle):
        raise SystemExit("--workers: the profile has no Dask worker's samples; record it with "
                         "--attach --workers (py-spy --subprocesses)")
    report(busy, idle, in_io, trials_in(args.run_dir) if args.run_dir else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
