"""Outages a grid rides out, and two runs of one grid at once, on the fault tests' grid
(tests/flows/grids.GRID) with real stores: an MLflow server paused mid-grid, the grid's Optuna
database locked by another process mid-grid, and two `damptune tune` processes on one run
directory. Each ends equal to the clean run, with one MLflow run per trial.

The outages are shaped by what the grid does, not by a clock: the MLflow server stays stopped
until requests of the grid gave up on it (their sockets, closed by the client with a request
unread, in /proc/net/tcp), the lock is held until a write of the grid failed on it. So each
test meets the retries it holds, and fails without them."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.tune import tune
from infra.stack import free_port
from tasks.search import storage_for
from tests.flows.grids import GRID, mlflow_server, runs_per_trial, trials_of, while_a_trial_trains

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def _wait_for(ready, *, timeout, every=0.1):
    """Whether ``ready()`` came true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(every)
    return bool(ready())


def _given_up(port):
    """Connections to the server on ``port`` that their client closed with a request the
    server has not read (CLOSE_WAIT, more unread than the FIN's one): requests that gave up
    waiting for it."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return sum(int(r[1].rsplit(":", 1)[1], 16) == port and r[3] == "08"
               and int(r[4].split(":")[1], 16) > 1 for r in rows)


def _mlflow_trial_runs(uri):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("damptune-g")
    return client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'",
                              max_results=1000)


def _attempts(run_dir):
    """(cell, trial number) -> the process id of each attempt that trained it (the work log's
    ``trial-N.attempts``, one line per attempt: tasks/worklog.py)."""
    root = Path(run_dir) / "worklog"
    return {(str(p.parent.relative_to(root)), int(p.stem.split("-")[1])):
            [json.loads(line)["pid"] for line in p.read_text().splitlines() if line.strip()]
            for p in root.rglob("*.attempts")}


def _n_trials(trials):
    return sum(len(t) for t in trials.values())


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net/tcp")
def test_an_mlflow_server_paused_mid_grid_is_ridden_out(tmp_path, scheduler, clean,
                                                        monkeypatch):
    """The MLflow server is stopped (SIGSTOP to its process group) while a trial trains, and
    continued (SIGCONT) once two of the grid's requests gave up on it. Each request waits at
    most 5 s, without MLflow's own retries, so only the pipeline's retries
    (tasks.tracking.with_retries) ride the pause out. The grid then finishes as if nothing had
    happened: equal to the clean run, one MLflow run per trial, all FINISHED, and no trial
    stopped and resumed (one attempt each in its work log)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    port, run_dir = free_port(), str(tmp_path / "r")
    uri = f"http://127.0.0.1:{port}"
    server = mlflow_server(tmp_path / "mlflow", port)
    paused = []

    def pause():
        os.killpg(server.pid, signal.SIGSTOP)
        try:
            paused.append(_wait_for(lambda: _given_up(port) >= 2, timeout=120))
        finally:
            os.killpg(server.pid, signal.SIGCONT)

    watcher = while_a_trial_trains(f"sqlite:///{run_dir}/optuna.db", run_dir, pause)
    try:
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, tracking_uri=uri,
             system_metrics=False, **GRID)
        watcher.join(150)
        assert paused == [True], "the pause never made a request of the grid give up"
        assert trials_of(run_dir, "g") == clean
        runs = _mlflow_trial_runs(uri)
        keys = [(r.data.tags["damptune.cell"], r.data.tags["damptune.trial_number"])
                for r in runs]
        assert len(keys) == len(set(keys)) == _n_trials(clean), sorted(keys)
        assert {r.info.status for r in runs} == {"FINISHED"}
        assert all(len(a) == 1 for a in _attempts(run_dir).values()), _attempts(run_dir)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


# holds an EXCLUSIVE lock on a SQLite database until a line comes on stdin
HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def test_an_optuna_database_locked_mid_grid_is_ridden_out(tmp_path, scheduler, clean,
                                                          monkeypatch):
    """Another process takes an EXCLUSIVE lock on the grid's optuna.db while a trial trains,
    and holds it until a write of the grid failed on it: SQLite's busy timeout
    (DAMPTUNE_SQLITE_TIMEOUT) made 0.2 s, so the lock outlasts it and only the pipeline's
    retries (tasks.search.with_storage_retries) ride it out. The grid then finishes equal to the
    clean run, one MLflow run per trial, no trial stopped and resumed."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    monkeypatch.setenv("DAMPTUNE_SQLITE_TIMEOUT", "0.2")
    run_dir = str(tmp_path / "r")
    storage = f"sqlite:///{run_dir}/optuna.db"
    failed = []  # the writes that met the lock: SQLite's "database is locked"

    def on_error(context):
        if isinstance(context.sqlalchemy_exception, OperationalError) and (
                "locked" in str(context.original_exception)):
            failed.append(str(context.original_exception))

    # the grid's own storage (one per URL and process), made here to watch its engine
    event.listen(storage_for(storage).engine, "handle_error", on_error)
    met = []

    def lock():
        holder = subprocess.Popen([sys.executable, "-c", HOLD, f"{run_dir}/optuna.db"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"
            met.append(_wait_for(lambda: bool(failed), timeout=120))
        finally:
            holder.communicate("release\n", timeout=60)

    watcher = while_a_trial_trains(storage, run_dir, lock)
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    watcher.join(150)
    assert met == [True], "no write of the grid met the lock"
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}
    assert len(runs_per_trial(run_dir, "g")) == _n_trials(clean)
    assert all(len(a) == 1 for a in _attempts(run_dir).values()), _attempts(run_dir)


def test_two_damptune_tune_processes_on_one_grid_train_each_trial_once(tmp_path, scheduler,
                                                                       clean, prefect_harness):
    """Two `damptune tune` processes of the same grid and run directory, started together on
    one Dask cluster: both exit 0, both train trials (the work log names the process of each
    attempt), no trial is trained twice (one attempt each, one MLflow run each), and the
    studies hold the clean run's trials, by number, all finished.

    Not the clean run's values: a run asks a cell's next trial while the other run's trains
    (two trials of a cell at once, as ``max_concurrent_trials=2``), so that trial's pruning
    bound misses its neighbour's value (seen: n2/geodamp/mlp trial 2 COMPLETE, PRUNED in the
    clean run; docs/fault-tolerance.md keeps exact repeats to one trial of a cell at a time)."""
    run_dir = tmp_path / "two"
    args = [sys.executable, "-m", "damptune", "tune", "--networks", "2", "--algorithms",
            "geodamp,padadamp", "--models", "mlp", "--trials", "3", "--epochs", "3",
            "--target", "0.45", "--validation-seeds", "0", "--checkpoint-seconds", "0.5",
            "--grid-name", "g", "--run-dir", str(run_dir), "--cluster", scheduler,
            "--no-progress"]
    env = {**os.environ, "PREFECT_API_URL": prefect_harness}
    logs = [open(tmp_path / f"run{i}.log", "w+") for i in range(2)]  # noqa: SIM115
    procs = [subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True) for log in logs]
    try:
        codes = [p.wait(600) for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    tails = []
    for log in logs:
        log.seek(0)
        tails.append(log.read()[-3000:])
        log.close()
    assert codes == [0, 0], tails
    trials = trials_of(run_dir, "g")
    assert {cell: [n for n, *_ in t] for cell, t in trials.items()} == {
        cell: [n for n, *_ in t] for cell, t in clean.items()}, trials
    assert {state for t in trials.values() for _, state, *_ in t} <= {"COMPLETE", "PRUNED"}
    runs = runs_per_trial(run_dir, "g")
    assert set(runs.values()) == {1} and len(runs) == _n_trials(clean), runs
    attempts = _attempts(run_dir)
    assert all(len(pids) == 1 for pids in attempts.values()), attempts
    assert {pids[0] for pids in attempts.values()} == {p.pid for p in procs}, attempts
