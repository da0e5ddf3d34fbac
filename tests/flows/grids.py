"""The small grid the fault tests run, and what they read back from Optuna and MLflow."""

import threading
import time

import optuna
from mlflow.tracking import MlflowClient

from tasks.search import storage_for

GRID = dict(networks=[2], algorithms=["geodamp", "padadamp"], models=["mlp"], trials=3,
            epochs=3, target_accuracy=0.45, checkpoint_seconds=0.5)


def trials_of(run_dir, grid_name):
    storage = f"sqlite:///{run_dir}/optuna.db"
    out = {}
    for s in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        out[s.study_name.split("/", 1)[1]] = [
            (t.number, t.state.name, t.params, t.value) for t in study.trials]
    return out


def runs_per_trial(run_dir, grid_name):
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    exp = client.get_experiment_by_name(f"damptune-{grid_name}")
    counts = {}
    for r in client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'",
                                max_results=1000):
        key = (r.data.tags["damptune.cell"], r.data.tags["damptune.trial_number"])
        counts[key] = counts.get(key, 0) + 1
    return counts


def after_first_finished_trial(storage, action):
    """A started thread that calls ``action()`` once the grid's storage holds a finished
    trial (the fault lands mid-grid, with work done and work left)."""
    def watch():
        while True:
            time.sleep(0.3)
            try:
                done = sum(t.state.is_finished() for s in storage_for(storage).get_all_studies()
                           for t in storage_for(storage).get_all_trials(s._study_id))
            except Exception:  # noqa: BLE001 - not created yet
                continue
            if done >= 1:
                action()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher
