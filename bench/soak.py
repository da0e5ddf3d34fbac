"""Soak test (outside CI): SIGKILL a grid many times at random moments, then let it finish.

Each round starts ``damptune tune`` on the same run directory and kills its whole process
group (the flow, its Dask workers) after a random time. A last run finishes the grid. The
report: kills injected, trials finished, duplicates (Optuna trials beyond the total, MLflow
runs per trial beyond one) and lost work: the updates and training seconds each trial redid
after a kill (``tasks/worklog.py``: every attempt records how far its dead predecessor got past
the checkpoint it resumes from), against the checkpoint interval.

Run: ``python bench/soak.py --kills 8 [--min-s 10 --max-s 40] [--run-dir runs/soak]``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHECKPOINT_SECONDS = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--min-s", type=float, default=10.0)
    parser.add_argument("--max-s", type=float, default=40.0)
    parser.add_argument("--run-dir", default="runs/soak")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=4)
    args = parser.parse_args(argv)

    import optuna
    from mlflow.tracking import MlflowClient

    shutil.rmtree(args.run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "damptune", "tune", "--networks", "2,4", "--algorithms",
           "geodamp,padadamp,adadamp", "--models", "mlp", "--trials", str(args.trials),
           "--epochs", "4", "--grid-name", "soak", "--run-dir", args.run_dir,
           "--checkpoint-seconds", str(CHECKPOINT_SECONDS), "--no-progress"]
    env = {**os.environ, "DAMPTUNE_LEASE_TTL": "6", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    for i in range(args.kills):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        delay = rng.uniform(args.min_s, args.max_s)
        try:
            proc.wait(timeout=delay)
            print(f"round {i + 1}: the grid finished before the kill")
            break
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"round {i + 1}: SIGKILL after {delay:.1f} s", flush=True)
    final = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - t0
    if final.returncode != 0:
        print(final.stderr[-3000:])
        return 1

    storage = f"sqlite:///{os.path.abspath(args.run_dir)}/optuna.db"
    studies = optuna.get_all_study_summaries(storage)
    states: Counter[str] = Counter()
    extra = 0
    for s in studies:
        trials = optuna.load_study(study_name=s.study_name, storage=storage).trials
        states.update(t.state.name for t in trials)
        extra += max(0, len(trials) - args.trials)
    client = MlflowClient(f"sqlite:///{os.path.abspath(args.run_dir)}/mlflow.db")
    exp = client.get_experiment_by_name("damptune-soak")
    runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'",
                              max_results=5000)
    per_trial = Counter((r.data.tags["damptune.cell"], r.data.tags["damptune.trial_number"])
                        for r in runs)
    from tasks.worklog import summary

    work = summary(os.path.abspath(args.run_dir))
    resumed = [w for w in work.values() if w["attempts"] > 1]
    lost_updates = sum(w["lost_updates"] for w in work.values())
    lost_s = sum(w["lost_seconds"] for w in work.values())
    worst = max((w["max_lost_seconds"] for w in work.values()), default=0.0)
    print("\n| kills | trials finished | states | Optuna trials beyond the total | "
          "MLflow runs per trial > 1 | trials resumed after a kill | updates redone | "
          "training s redone | worst attempt's loss (s) | checkpoint interval (s) | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.kills} | {states['COMPLETE'] + states['PRUNED']} / "
          f"{len(studies) * args.trials} | {dict(states)} | {extra} | "
          f"{sum(1 for n in per_trial.values() if n > 1)} | {len(resumed)} | {lost_updates} | "
          f"{lost_s:.2f} | {worst:.2f} | {CHECKPOINT_SECONDS:g} | {elapsed:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
