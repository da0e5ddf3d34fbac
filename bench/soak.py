"""Is anything lost when a running grid is killed many times at random moments? A soak test,
outside CI.

Two modes:

* default — each round starts ``damptune tune`` on the same run directory and SIGKILLs its
  whole process group (the flow, its Dask workers) after a random time; a last run finishes
  the grid.
* ``--replace-workers`` — a spot cluster that replaces machines: the soak owns a Dask
  ``LocalCluster`` and SIGKILLs one of its worker processes at random moments while one
  ``damptune tune`` runs on it (``--cluster tcp://…``); each worker's nanny starts a
  replacement at a new address. The same grid first runs on the same cluster without kills
  (the clean reference; the compute calibration is shared through ``DAMPTUNE_CACHE``), and the
  report says whether every trial's state, parameters and value equal the clean run's.

The report: kills injected, trials finished, FAIL and interrupted trials, duplicates (Optuna
trials beyond the total, MLflow runs per trial beyond one) and lost work: the updates and
training seconds each trial redid after a kill (``tasks/worklog.py``), against the checkpoint
interval.

Goals: every trial finished, 0 FAIL and 0 interrupted; 0 duplicates (Optuna trials beyond the
total, MLflow runs per trial); with ``--replace-workers``, trials equal to the clean run's;
each attempt's loss at most one checkpoint interval (2 s).

Run: ``python bench/soak.py --kills 8 [--min-s 10 --max-s 40] [--run-dir runs/soak]`` or
``python bench/soak.py --replace-workers --kills 6 --min-s 3 --max-s 10``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

CHECKPOINT_SECONDS = 2.0
# the flow-kill soak: 6 cells; the worker-replacement soak: the scenario of issue 10
FLOW_GRID = ["--networks", "2,4", "--algorithms", "geodamp,padadamp,adadamp", "--models", "mlp",
             "--epochs", "4"]
WORKER_GRID = ["--networks", "2", "--algorithms", "geodamp,padadamp", "--models", "mlp",
               "--epochs", "3"]
ENV = {**os.environ, "DAMPTUNE_LEASE_TTL": "6", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def tune_cmd(grid: list[str], run_dir: str, trials: int, *extra: str) -> list[str]:
    """The soak's grid: its search cells only (no held-out stage), ``trials`` in each."""
    return [sys.executable, "-m", "damptune", "tune", *grid, "--trials", str(trials),
            "--grid-name", "soak", "--run-dir", run_dir, "--checkpoint-seconds",
            str(CHECKPOINT_SECONDS), "--validation-seeds", "0", "--no-progress", *extra]


def flow_kills(args: argparse.Namespace, rng: random.Random) -> tuple[int, str]:
    """SIGKILL rounds of the whole grid process, then a last run; (kills injected, run dir)."""
    cmd = tune_cmd(FLOW_GRID, args.run_dir, args.trials)
    injected = 0
    for i in range(args.kills):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=ENV, start_new_session=True)
        delay = rng.uniform(args.min_s, args.max_s)
        try:
            proc.wait(timeout=delay)
            print(f"round {i + 1}: the grid finished before the kill")
            break
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            injected += 1
            print(f"round {i + 1}: SIGKILL after {delay:.1f} s", flush=True)
    final = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if final.returncode != 0:
        raise SystemExit(f"the last run failed ({final.returncode}):\n{final.stderr[-3000:]}")
    return injected, args.run_dir


class WorkerKiller(threading.Thread):
    """SIGKILLs one random worker process of the cluster every U(min_s, max_s) seconds, at
    most ``kills`` times, until stopped; ``injected`` counts the kills that landed."""

    def __init__(self, address: str, args: argparse.Namespace, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.address, self.args, self.rng = address, args, rng
        self.stop, self.injected = threading.Event(), 0

    def run(self) -> None:
        from distributed import Client

        with Client(self.address, timeout="30s") as client:
            while self.injected < self.args.kills and not self.stop.wait(
                    self.rng.uniform(self.args.min_s, self.args.max_s)):
                workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
                if not workers:
                    continue
                victim = self.rng.choice(workers)
                try:
                    pid = client.run(os.getpid, workers=[victim])[victim]
                    os.kill(pid, signal.SIGKILL)
                except Exception as exc:  # noqa: BLE001 - it left by itself: no kill
                    print(f"no kill of {victim}: {exc}", flush=True)
                    continue
                self.injected += 1
                print(f"kill {self.injected}: SIGKILL worker {victim} (pid {pid})", flush=True)


def worker_kills(args: argparse.Namespace, rng: random.Random) -> tuple[int, str, bool]:
    """A clean run, then a run whose workers are killed and replaced, on one cluster;
    (kills injected, run dir of the churned run, whether its trials equal the clean run's)."""
    from damptune.cluster import local_cluster

    clean_dir, run_dir = os.path.join(args.run_dir, "clean"), os.path.join(args.run_dir, "churn")
    cluster = local_cluster(n_workers=2, local_directory=os.path.join(args.run_dir, "dask"))
    try:
        extra = ("--cluster", cluster.scheduler_address)
        clean = subprocess.run(tune_cmd(WORKER_GRID, clean_dir, args.trials, *extra),
                               capture_output=True, text=True, env=ENV)
        if clean.returncode != 0:
            raise SystemExit(f"the clean run failed:\n{clean.stderr[-3000:]}")
        killer = WorkerKiller(cluster.scheduler_address, args, rng)
        killer.start()
        churn = subprocess.run(tune_cmd(WORKER_GRID, run_dir, args.trials, *extra),
                               capture_output=True, text=True, env=ENV)
        killer.stop.set()
        killer.join(60)
        print(f"the churned run exited {churn.returncode}", flush=True)
        if churn.returncode != 0:
            print(churn.stderr[-3000:])
    finally:
        cluster.close()
    return killer.injected, run_dir, trials_of(clean_dir) == trials_of(run_dir)


def trials_of(run_dir: str) -> dict[str, list[tuple[Any, ...]]]:
    import optuna

    storage = f"sqlite:///{os.path.abspath(run_dir)}/optuna.db"
    return {s.study_name: [(t.number, t.state.name, t.params, t.value) for t in
                           optuna.load_study(study_name=s.study_name, storage=storage).trials]
            for s in optuna.get_all_study_summaries(storage)}


def counts(run_dir: str, trials: int) -> dict[str, Any]:
    """States, duplicates and lost work of a finished soak run."""
    from mlflow.tracking import MlflowClient

    from tasks.worklog import summary

    studies = trials_of(run_dir)
    states = Counter(state for rows in studies.values() for _, state, *_ in rows)
    client = MlflowClient(f"sqlite:///{os.path.abspath(run_dir)}/mlflow.db")
    exp = client.get_experiment_by_name("damptune-soak")
    runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'",
                              max_results=5000)
    per_trial = Counter((r.data.tags["damptune.cell"], r.data.tags["damptune.trial_number"])
                        for r in runs)
    work = summary(os.path.abspath(run_dir))
    return {
        "finished": states["COMPLETE"] + states["PRUNED"], "total": len(studies) * trials,
        "states": dict(states), "fail": states["FAIL"], "interrupted": states["RUNNING"],
        "beyond": sum(max(0, len(rows) - trials) for rows in studies.values()),
        "doubled": sum(1 for n in per_trial.values() if n > 1),
        "resumed": sum(1 for w in work.values() if w["attempts"] > 1),
        "attempts": sum(w["attempts"] for w in work.values()),
        "lost_updates": sum(w["lost_updates"] for w in work.values()),
        "lost_s": sum(w["lost_seconds"] for w in work.values()),
        "worst_updates": max((w["max_lost_updates"] for w in work.values()), default=0),
        "worst_s": max((w["max_lost_seconds"] for w in work.values()), default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8, help="kills to inject, at most")
    parser.add_argument("--min-s", type=float, default=10.0)
    parser.add_argument("--max-s", type=float, default=40.0)
    parser.add_argument("--run-dir", default="runs/soak")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--replace-workers", action="store_true",
                        help="kill Dask workers (replaced by their nannies), not the flow")
    args = parser.parse_args(argv)
    shutil.rmtree(args.run_dir, ignore_errors=True)
    rng, t0 = random.Random(args.seed), time.monotonic()
    same = "n/a"
    if args.replace_workers:
        injected, run_dir, equal = worker_kills(args, rng)
        same = "yes" if equal else "NO"
    else:
        injected, run_dir = flow_kills(args, rng)
    c = counts(run_dir, args.trials)
    print("\n| mode | kills injected | trials finished | states | FAIL | interrupted | "
          "Optuna trials beyond the total | MLflow runs per trial > 1 | equal to the clean "
          "run | trials resumed | attempts | updates redone | training s redone | worst "
          "attempt's loss (updates / s) | checkpoint interval (s) | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    mode = "replace workers" if args.replace_workers else "kill the flow"
    print(f"| {mode} | {injected} | {c['finished']} / {c['total']} | {c['states']} | "
          f"{c['fail']} | {c['interrupted']} | {c['beyond']} | {c['doubled']} | {same} | "
          f"{c['resumed']} | {c['attempts']} | {c['lost_updates']} | {c['lost_s']:.2f} | "
          f"{c['worst_updates']} / {c['worst_s']:.2f} | {CHECKPOINT_SECONDS:g} | "
          f"{time.monotonic() - t0:.0f} |")
    ok = c["fail"] == 0 and c["beyond"] == 0 and c["doubled"] == 0 and same != "NO"
    key = "replace_workers" if args.replace_workers else "kill_flow"
    figures = {"kills": injected, "wall_s": time.monotonic() - t0,
               **{k: v for k, v in c.items() if k != "states"}}
    records.write("soak", figures={key: figures}, mode=key, goals={
        "every trial finished, 0 FAIL, 0 interrupted": (
            c["finished"] == c["total"] and c["fail"] == 0 and c["interrupted"] == 0),
        "0 duplicates (Optuna trials beyond the total, MLflow runs per trial)":
        c["beyond"] == 0 and c["doubled"] == 0,
        "trials equal to the clean run's (--replace-workers)":
        None if same == "n/a" else same == "yes",
        f"each attempt's loss <= one checkpoint interval ({CHECKPOINT_SECONDS:g} s)":
        c["worst_s"] <= CHECKPOINT_SECONDS})
    return 0 if ok and c["finished"] == c["total"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
