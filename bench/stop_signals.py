"""How long `damptune tune` takes to stop after a signal, and with what status.

Starts `damptune tune` (the default grid, its own temporary Prefect server, a run directory
of its own) in a session of its own with SIGINT and SIGTERM at their defaults, as a terminal
starts it; after ``--after`` seconds sends the signal to its whole process group (what
Ctrl-C, ``timeout``, a batch scheduler or ``kill -- -PGID`` do: the Dask workers get it too)
or to its PID only (``--scope pid``: what a container runtime sends), or to every process
of the run, its temporary Prefect server's session too (``--scope every``: systemd stopping a
unit, a machine's shutdown); then prints the exit
status, the seconds from the signal to the exit, and the processes left behind (in its group,
and its temporary Prefect server). Exit status 75 is the interrupted run (a rerun continues).

    python bench/stop_signals.py --signals TERM,INT --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _defaults() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _servers(pid: int) -> list[int]:
    """The temporary Prefect servers of the run ``pid`` (their PIDs)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "flows.prefect_server" in cmd and str(pid) in cmd:
            found.append(proc.pid)
    return found


def _left(pid: int) -> tuple[int, int]:
    """(processes left in the run's group, temporary Prefect servers left of the run)."""
    group = 0
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            group += os.getpgid(proc.pid) == pid
    return group, len(_servers(pid))


def _send(pid: int, sig: int, scope: str) -> None:
    if scope == "pid":
        os.kill(pid, sig)
        return
    os.killpg(pid, sig)
    for server in _servers(pid) if scope == "every" else []:  # its own session
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server, sig)


def one_stop(name: str, *, scope: str, after: float, wait: float) -> dict:
    run_dir = tempfile.mkdtemp(prefix=f"stop-{name}-")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    with open(os.path.join(run_dir, "tune.log"), "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "damptune", "tune", "--run-dir", run_dir,
                                 "--no-progress"], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT, start_new_session=True, preexec_fn=_defaults)
    time.sleep(after)
    sig = getattr(signal, "SIG" + name)
    t0 = time.monotonic()
    _send(proc.pid, sig, scope)
    try:
        status: int | None = proc.wait(wait)
    except subprocess.TimeoutExpired:
        status = None
    seconds = time.monotonic() - t0
    time.sleep(3)
    group, servers = _left(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if status is None:
        proc.wait()
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"signal": name, "scope": scope, "status": status, "seconds": seconds,
            "left_in_group": group, "servers_left": servers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signals", default="TERM,INT", help="comma-separated: TERM, INT")
    ap.add_argument("--scope", choices=["group", "pid", "every"], default="group")
    ap.add_argument("--after", type=float, default=90.0, help="seconds before the signal")
    ap.add_argument("--wait", type=float, default=420.0, help="seconds to wait for the exit")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    for name in args.signals.split(","):
        runs = [one_stop(name, scope=args.scope, after=args.after, wait=args.wait)
                for _ in range(args.repeats)]
        for r in runs:
            status = "still running" if r["status"] is None else f"exit {r['status']}"
            target = "every process" if r["scope"] == "every" else f"the {r['scope']}"
            print(f"SIG{name} to {target}: {status} after {r['seconds']:.1f} s; "
                  f"left: {r['left_in_group']} in its group, {r['servers_left']} "
                  "temporary Prefect server(s)", flush=True)
        secs = [r["seconds"] for r in runs]
        print(f"SIG{name}: {min(secs):.1f} / {statistics.median(secs):.1f} / {max(secs):.1f} s "
              f"(min / median / max of {len(secs)}); exit 75 in "
              f"{sum(r['status'] == 75 for r in runs)} of {len(runs)}", flush=True)


if __name__ == "__main__":
    main()
