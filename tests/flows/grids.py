"""The small grid the fault tests run, and what they read back from Optuna and MLflow."""

import os
import threading
import time

import optuna
from mlflow.tracking import MlflowClient

from tasks.search import storage_for

GRID = dict(networks=[2], algorithms=["geodamp", "padadamp"], models=["mlp"], trials=3,
            epochs=3, target_accuracy=0.45, checkpoint_seconds=0.5,
            validation_seeds=1)  # a held-out seed per cell: its validation trial too survives


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
    return _when(lambda: _finished(storage) >= 1, action, every=0.3)


def while_a_trial_trains(storage, run_dir, action):
    """A started thread that calls ``action()`` once the grid's storage holds a finished trial
    and another trial is training: RUNNING, with an update in its work log. The fault lands
    inside that trial, which must then resume (a second attempt in its work log)."""
    return _when(lambda: _finished(storage) >= 1 and _training(storage, run_dir), action,
                 every=0.1)


def _when(ready, action, *, every):
    def watch():
        while True:
            time.sleep(every)
            try:
                if not ready():
                    continue
            except Exception:  # noqa: BLE001 - not created yet
                continue
            action()
            return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def _trials(storage):
    """(study name, frozen trial) of every trial in the grid's storage."""
    store = storage_for(storage)
    return [(s.study_name, t) for s in store.get_all_studies()
            for t in store.get_all_trials(s._study_id)]


def _finished(storage):
    return sum(t.state.is_finished() for _, t in _trials(storage))


def _training(storage, run_dir):
    """Whether a RUNNING trial's work log shows an update done (``tasks/worklog.py``)."""
    return any(_live_update(os.path.join(run_dir, "worklog", name.split("/", 1)[1],
                                         f"trial-{t.number}.live")) >= 1
               for name, t in _trials(storage)
               if t.state == optuna.trial.TrialState.RUNNING)


def _live_update(path):
    """The latest update in a trial's live work-log line; 0 if there is none yet."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
