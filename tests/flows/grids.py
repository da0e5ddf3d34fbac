"""The small grid the fault tests run, and what they read back from Optuna and MLflow."""

import os
import threading
import time

import optuna
from mlflow.tracking import MlflowClient

from damptune.records import UpdateRecord
from tasks.driver import DAMPTUNE_STATE, INTERRUPTED
from tasks.search import storage_for
from tasks.worklog import WorkLog

GRID = dict(networks=[2], algorithms=["geodamp", "padadamp"], models=["mlp"], trials=3,
            epochs=3, target_accuracy=0.45, checkpoint_seconds=0.5,
            validation_seeds=0)  # the search only: 6 trials. The held-out stages run the same
# driver; a fault test of them is test_resume's stop test (HELD_OUT), and test_validation's rerun
HELD_OUT = {**GRID, "validation_seeds": 1}  # a selection stage and a held-out seed per cell


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


WATCH_S = 600.0  # a watcher whose moment never came gives up then (a test's own timeout)
HOLD_S = 60.0  # the longest a trial is held at its update while the action runs (a hang guard)


def after_first_finished_trial(storage, action):
    """A started thread that calls ``action()`` inside a trial, mid-grid: at the first update
    of a trial that trains once the grid's storage (``sqlite:///<run_dir>/optuna.db``) holds a
    finished trial, with work done and work left. That trial's driver is held at that update
    (its work log's record of it) until ``action()`` has returned, so the fault surely lands
    while it trains, never between two trials nor after a trial's last update. Then the
    thread's ``trial`` is (study name, number) of that trial, and its ``landed`` is True when
    the trial was still RUNNING in Optuna once the action had returned."""
    moment = _Moment(_run_dir_of(storage))

    def watch():
        deadline = time.monotonic() + WATCH_S
        try:
            while not _poll(lambda: _finished(storage) >= 1):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.1)
            moment.ready.set()
            if not moment.now.wait(max(0.0, deadline - time.monotonic())):
                return
            _fire(watcher, storage, _study_of(storage, moment.cell), moment.number, action)
        finally:
            moment.done.set()  # the held trial goes on
            _release(moment)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.trial, watcher.landed = None, False
    _hold_first_updates(moment)
    watcher.start()
    return watcher


def while_a_trial_trains(storage, run_dir, action):
    """A started thread that calls ``action()`` once the grid's storage holds a finished trial
    and another trial is training: RUNNING, with an update in its work log. The fault lands
    inside that trial, which must then resume (a second attempt in its work log). The trial
    is not held meanwhile (``action`` may wait on the grid's own work); the thread's
    ``trial`` and ``landed`` say which trial it saw training and whether that trial was still
    RUNNING once the action had returned."""
    def watch():
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            time.sleep(0.1)
            seen = _poll(lambda: _finished(storage) >= 1 and _training(storage, run_dir))
            if seen:
                _fire(watcher, storage, *seen, action)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.trial, watcher.landed = None, False
    watcher.start()
    return watcher


def _fire(watcher, storage, study_name, number, action):
    """``action()``, then whether the trial was still RUNNING (a finished trial is never
    RUNNING again: the action began while it was unfinished)."""
    watcher.trial = (study_name, number)
    action()
    watcher.landed = _state(storage, study_name, number) == optuna.trial.TrialState.RUNNING


def _poll(ready):
    """``ready()``, False while the storage is not there yet or busy."""
    try:
        return ready()
    except Exception:  # noqa: BLE001 - not created yet, or briefly locked
        return False


class _Moment:
    """A run directory's first trial update after ``ready``: the trial named there waits at it
    (:data:`HOLD_S` at most) until ``done``."""

    def __init__(self, run_dir):
        self.worklog = os.path.join(os.path.abspath(run_dir), "worklog") + os.sep
        self.ready, self.now, self.done = (threading.Event(), threading.Event(),
                                           threading.Event())
        self.cell, self.number, self.lock = None, None, threading.Lock()

    def arrived(self, log, record):
        """Called by a trial's work log after it recorded ``record``: the first update of a
        trial of this run directory, once ready, is held until done."""
        if (not self.ready.is_set() or not isinstance(record, UpdateRecord)
                or log.attempt is None or record.update != log.attempt["resumed_at"] + 1
                or not os.path.abspath(log.live_path).startswith(self.worklog)):
            return
        with self.lock:  # two trials of the grid may get here at once: the first is held
            if self.now.is_set():
                return
            cell, name = os.path.split(os.path.relpath(os.path.abspath(log.live_path),
                                                       self.worklog))
            self.cell, self.number = cell, int(name.removeprefix("trial-").split(".")[0])
            self.now.set()
        self.done.wait(HOLD_S)


_MOMENTS: list[_Moment] = []  # the watchers waiting at trials' first updates
_REAL_RECORD: list = []  # WorkLog.record while a spy wraps it
_SPY_LOCK = threading.Lock()


def _hold_first_updates(moment):
    """Make every trial's work log (the driver records each update there, in this process)
    tell ``moment`` of its updates: a spy around the real ``WorkLog.record``, in place while
    some watcher waits."""
    with _SPY_LOCK:
        if not _MOMENTS:
            real = WorkLog.record
            _REAL_RECORD.append(real)

            def spy(log, rec):
                out = real(log, rec)
                for waiting in list(_MOMENTS):
                    waiting.arrived(log, rec)
                return out

            WorkLog.record = spy
        _MOMENTS.append(moment)


def _release(moment):
    with _SPY_LOCK:
        _MOMENTS.remove(moment)
        if not _MOMENTS:
            WorkLog.record = _REAL_RECORD.pop()


def _run_dir_of(storage):
    prefix, suffix = "sqlite:///", "/optuna.db"
    assert storage.startswith(prefix) and storage.endswith(suffix), storage
    return storage[len(prefix):-len(suffix)]


def _study_of(storage, cell):
    """The name of the grid's study of ``cell`` (``<grid>/<cell key>``)."""
    for _ in range(20):
        names = _poll(lambda: [s.study_name for s in storage_for(storage).get_all_studies()])
        if names:
            return next(n for n in names if n.split("/", 1)[1] == cell)
        time.sleep(0.1)
    raise AssertionError(f"the grid's storage {storage} could not be read")


def _state(storage, study_name, number):
    """The Optuna state of one trial, read again from the storage (retried while it is busy)."""
    for _ in range(20):
        try:
            study = optuna.load_study(study_name=study_name, storage=storage)
            return study.trials[number].state
        except Exception:  # noqa: BLE001 - the grid's SQLite briefly locked
            time.sleep(0.1)
    return None


def _trials(storage):
    """(study name, frozen trial) of every trial in the grid's storage."""
    store = storage_for(storage)
    return [(s.study_name, t) for s in store.get_all_studies()
            for t in store.get_all_trials(s._study_id)]


def _finished(storage):
    return sum(t.state.is_finished() for _, t in _trials(storage))


def _training(storage, run_dir):
    """(study name, number) of a RUNNING trial whose work log shows an update done
    (``tasks/worklog.py``) and that no run left interrupted; None when there is none."""
    for name, t in _trials(storage):
        if (t.state == optuna.trial.TrialState.RUNNING
                and t.user_attrs.get(DAMPTUNE_STATE) != INTERRUPTED
                and live_update(os.path.join(run_dir, "worklog", name.split("/", 1)[1],
                                              f"trial-{t.number}.live")) >= 1):
            return name, t.number
    return None


def live_update(path):
    """The latest update in a trial's live work-log line; 0 if there is none yet."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def mlflow_server(root, port):
    """A real MLflow server on 127.0.0.1 (SQLite store in ``root``), answering /health; in a
    session of its own, to be stopped by its process group's id."""
    import contextlib
    import signal
    import subprocess
    import sys
    import urllib.request

    root.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--artifacts-destination", str(root / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the MLflow server exited"
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"http://127.0.0.1:{port}/health", timeout=2):
            return proc
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the MLflow server did not answer /health in 180 s")
