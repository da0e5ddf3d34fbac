"""Kills, interruptions and reruns lose nothing and repeat nothing (real Prefect harness,
Optuna and MLflow on SQLite, real Dask clusters)."""

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest
from mlflow.tracking import MlflowClient

from damptune import interrupt
from flows.tune import tune
from infra.stack import _default_sigint
from tasks import worklog
from tasks.driver import DAMPTUNE_STATE, INTERRUPTED, RESUMED
from tasks.grid import Cell, GridSettings
from tasks.leases import Leases
from tasks.report import GridIncomplete
from tasks.search import open_study, sampler_for
from tests.flows.grids import (
    GRID,
    HELD_OUT,
    after_first_finished_trial,
    mlflow_server,
    runs_per_trial,
    trials_of,
)
from tests.flows.test_prefect_server import _server_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def _marks(storage):
    """(study, trial number) -> (Optuna state, damptune_state user attribute or None), as
    Optuna's dashboard reads them from the storage."""
    return {(s.study_name, t.number): (t.state.name, t.user_attrs.get(DAMPTUNE_STATE))
            for s in optuna.get_all_study_summaries(storage)
            for t in optuna.load_study(study_name=s.study_name, storage=storage).trials}


def test_interrupted_grid_resumes_to_the_clean_result(tmp_path, scheduler, clean,
                                                      monkeypatch):
    """Interrupted (a spot reclaim's SIGTERM) after the first trial, then rerun "on another
    machine": a cold compute-calibration cache, so only the calibration kept in each study
    makes the rerun's trials simulate time as the first run's did. Optuna's storage (what its
    dashboard shows) says which trials wait for the rerun: the ones left RUNNING carry
    damptune_state=interrupted, and after the rerun none does (they read resumed)."""
    run_dir = str(tmp_path / "r")
    storage = f"sqlite:///{run_dir}/optuna.db"

    watcher = after_first_finished_trial(storage,
                                         lambda: interrupt.request("test: spot reclaim"))
    with pytest.raises(GridIncomplete, match="interrupted") as stopped:  # not a success
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    watcher.join()
    interrupt.clear()
    rows = stopped.value.rows
    assert sum(r["n_interrupted"] for r in rows) >= 1  # interrupted, not failed
    assert all(r["n_failed"] == 0 for r in rows) and stopped.value.exit_code == 75
    marks = _marks(storage)
    waiting = {k for k, (state, _) in marks.items() if state == "RUNNING"}
    assert waiting and {k for k, (_, m) in marks.items() if m == INTERRUPTED} == waiting, marks
    # the stop landed inside a trial that was training, which waits for the rerun
    assert watcher.landed and watcher.trial in waiting, (watcher.trial, marks)
    monkeypatch.setenv("DAMPTUNE_CACHE", str(tmp_path / "another-machine"))
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    assert trials_of(run_dir, "g") == clean  # same numbers, params, states and values
    marks = _marks(storage)
    assert not any(m == INTERRUPTED for _, m in marks.values()), marks
    assert all(marks[k][1] == RESUMED and marks[k][0] in {"COMPLETE", "PRUNED"}
               for k in waiting), marks
    assert set(runs_per_trial(run_dir, "g").values()) == {1}


def test_a_stop_starts_no_more_cells_then_a_rerun_equals_the_clean_run(tmp_path, scheduler,
                                                                       clean, monkeypatch):
    """A stop asked while the first cell trains (one cell at a time; a spy on the cell's log
    of its first finished trial asks it): that cell checkpoints and ends interrupted, and no
    other cell starts. Their studies and MLflow runs are not created: each used to open, ask a
    trial 0 that trained nothing and leave it RUNNING (a search cell), or open an empty
    validation study. The grid ends interrupted (exit status 75) and names the cells not
    started; a rerun runs them and ends equal to the clean run. The grid has its held-out
    stages (``HELD_OUT``: a selection and a held-out seed per cell), which the clean run
    lacks: its search cells equal the clean run's, and each held-out trial trains once."""
    import tasks.cell

    real_log = tasks.cell._log

    def log_then_stop(result, cell_key):
        real_log(result, cell_key)
        interrupt.request("test: a stop while the first cell trains")

    monkeypatch.setattr(tasks.cell, "_log", log_then_stop)
    run_dir = str(tmp_path / "o")
    with pytest.raises(GridIncomplete, match="5 cell.s. not started") as stopped:
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, max_concurrent_cells=1,
             **HELD_OUT)
    monkeypatch.setattr(tasks.cell, "_log", real_log)
    interrupt.clear()
    assert stopped.value.exit_code == 75 and not stopped.value.failures
    assert stopped.value.not_started == [
        "n2/padadamp/mlp", "n2/geodamp/mlp/selection", "n2/padadamp/mlp/selection",
        "n2/geodamp/mlp/validation", "n2/padadamp/mlp/validation"], stopped.value.not_started
    before = trials_of(run_dir, "g")
    assert list(before) == ["n2/geodamp/mlp"], before  # no other study was opened
    assert [s for _, s, *_ in before["n2/geodamp/mlp"]][-1] == "RUNNING", before
    assert {cell for cell, _ in runs_per_trial(run_dir, "g")} == {"n2/geodamp/mlp"}
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    exp = client.get_experiment_by_name("damptune-g")
    cell_runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'cell'")
    assert [r.data.tags["damptune.cell"] for r in cell_runs] == ["n2/geodamp/mlp"]
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **HELD_OUT)
    after = trials_of(run_dir, "g")
    assert {k: v for k, v in after.items() if k in clean} == clean
    held_out = {k: v for k, v in after.items() if k not in clean}
    assert sorted(held_out) == sorted(stopped.value.not_started[1:]), after
    assert all(s == "COMPLETE" for t in held_out.values() for _, s, *_ in t), held_out
    runs = runs_per_trial(run_dir, "g")
    assert set(runs.values()) == {1} and len(runs) == sum(len(t) for t in after.values()), runs


def test_cluster_lifetime_reached_stops_interrupted_then_a_rerun_equals_the_clean_run(
        tmp_path, scheduler, clean):
    """``max_cluster_lifetime`` that the cluster has already outlived (the session's scheduler
    started before the clean run): each cell's first trial stops before its first update (a
    trial that starts past the limit trains nothing; the ranks' first segment, ~1 s, used to
    train on, and a short trial finished in it), and the flow run ends *interrupted*
    (GridIncomplete, exit status 75: run it again), no trial FAIL. A rerun with the limit
    lifted trains them and ends equal to the clean run: one MLflow run per trial, no update
    trained twice."""
    from distributed import Client

    with Client(scheduler, timeout="10s") as client:
        started = client.scheduler_info(n_workers=0).get("started")
    # the limit is 2 s: past already, so every trial stops at once (no race on timing)
    assert started is not None and time.time() - started > 2, started
    run_dir = str(tmp_path / "l")
    with pytest.raises(GridIncomplete, match="interrupted") as stopped:
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, max_cluster_lifetime="2s",
             **GRID)
    assert stopped.value.exit_code == 75 and not stopped.value.failures
    before = trials_of(run_dir, "g")
    running = [(cell, n) for cell, trials in before.items()
               for n, state, _, _ in trials if state == "RUNNING"]
    assert {cell for cell, _ in running} == {"n2/geodamp/mlp", "n2/padadamp/mlp"}, before
    assert all(state in ("RUNNING", "COMPLETE", "PRUNED")
               for trials in before.values() for _, state, _, _ in trials), before
    trained = worklog.summary(run_dir)  # an attempt is logged at its first update
    assert not set(running) & set(trained), trained  # the stopped trials trained nothing
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}
    work = worklog.summary(run_dir)
    assert all(work[key]["attempts"] == 1 for key in running), work
    assert all(w["attempts"] <= 2 and w["lost_updates"] == 0 for w in work.values()), work


def _trial_0_leased_by(run_dir, owner, *, ttl):
    """Trial 0 of the fault tests' n2/geodamp/mlp study, asked as the clean run asks it, with
    its lease held by the run ``owner`` for ``ttl`` s (a run that died, or one that trains
    it): (the study, the trial, (the leases, the trial's lease key))."""
    from tasks.search import distributions

    storage = f"sqlite:///{run_dir}/optuna.db"
    os.makedirs(run_dir)
    settings = GridSettings(grid_name="g", storage=storage, epochs=3, trials=3,
                            target_accuracy=0.45)
    cell = Cell(2, "geodamp", "mlp")
    study = open_study(settings, cell, n_train=4000)
    study.sampler = sampler_for(settings, 0, study.study_name)
    trial = study.ask(distributions(settings, cell))
    key, leases = f"{study.study_name}#{trial.number}", Leases(storage, ttl=ttl)
    assert leases.acquire(key, owner)
    return study, trial, (leases, key)


def _wait_for_lease_expiry(db, key, timeout=30.0):
    """Wait (within ``timeout`` seconds) until the lease ``key`` in the SQLite database ``db``
    (table damptune_leases, tasks/leases.py) has expired by the clock it was written with."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
            [(expires,)] = conn.execute("SELECT expires FROM damptune_leases WHERE key = ?",
                                        (key,)).fetchall()
        if expires < time.time():
            return
        assert time.monotonic() < deadline, f"the lease {key} never expired ({expires})"
        time.sleep(0.01)


@pytest.mark.parametrize("lease_left", [0.01, 30.0], ids=["expired", "unexpired"])
def test_stale_running_trial_is_taken_over_under_its_number(tmp_path, scheduler, clean,
                                                            lease_left, monkeypatch):
    """A trial left RUNNING by a process that died is resumed, not replaced: the study ends
    with the same trials as the clean run. Its lease has expired, or the rerun starts while it
    has not (the death was seconds ago, as when a cancelled flow run is run again at once):
    the rerun then waits for it before asking a new trial, whose pruning bound would otherwise
    miss its value (it did: trial 0, resumed after trials 1 and 2, was pruned by their
    best). Whether the rerun saw the lease held is asserted, so a slow start (a flow run has
    begun 7.5 s late on a loaded machine) cannot turn the unexpired case into the other."""
    import tasks.driver

    held, real_held = [], tasks.driver.StudyDriver.held_elsewhere
    monkeypatch.setattr(tasks.driver.StudyDriver, "held_elsewhere",
                        lambda self: held.append(real_held(self)) or held[-1])
    run_dir = str(tmp_path / "s")
    _, _, (_, key) = _trial_0_leased_by(run_dir, "dead-run", ttl=lease_left)  # asked by a
    if lease_left < 1:  # run that then died; the rerun starts once its lease has expired
        _wait_for_lease_expiry(f"{run_dir}/optuna.db", key)
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    assert trials_of(run_dir, "g") == clean
    assert any(held) == (lease_left > 1), held  # the rerun waited for the dead run's lease


def test_a_trial_another_run_finishes_while_this_one_waits_does_not_end_the_cell(
        tmp_path, scheduler, monkeypatch):
    """Another live run trains trial 0 (it holds its lease), so this run waits: no new trial
    is due while it runs. The other run finishes it just after this run read the study and
    found none due, and before it asks trial 1. The cell must then ask the rest itself. It
    ended instead, its search short of its trials: with no trial left running the grid
    returned as complete (only trial 0 finished, nothing validated); with the other run's
    next trial running, the grid reported it as interrupted (a make test failure of the
    concurrency test below). The moment is forced here: a spy on ``next_batch`` finishes the
    other run's trial right after it answered None."""
    import tasks.driver

    run_dir = tmp_path / "w"
    study, other, (others, key) = _trial_0_leased_by(run_dir, "other-run", ttl=60)
    real_next, told = tasks.driver.StudyDriver.next_batch, []

    def next_batch(self):
        batch = real_next(self)
        if batch is None and not told and self.study.study_name == study.study_name:
            study.tell(other.number, state=optuna.trial.TrialState.PRUNED)  # the other run
            others.release(key, "other-run")  # ends its trial; it has not asked the next yet
            told.append(self.owner)
        return batch

    monkeypatch.setattr(tasks.driver.StudyDriver, "next_batch", next_batch)
    tune(grid_name="g", run_dir=str(run_dir), cluster=scheduler,
         **{**GRID, "algorithms": ["geodamp"]})
    assert told  # the other run's trial ended between the two reads
    trials = trials_of(run_dir, "g")
    assert [(n, s) for n, s, *_ in trials["n2/geodamp/mlp"]][0] == (0, "PRUNED"), trials
    assert [n for n, *_ in trials["n2/geodamp/mlp"]] == [0, 1, 2], trials
    assert {s for _, s, *_ in trials["n2/geodamp/mlp"]} <= {"COMPLETE", "PRUNED"}, trials
    assert set(runs_per_trial(run_dir, "g")) == {("n2/geodamp/mlp", "1"),
                                                  ("n2/geodamp/mlp", "2")}


EVERY = 20  # updates between checkpoints of the flow-kill test: lost work is a count


def _tune_process(run_dir, api_url):
    """`damptune tune` of the fault tests' grid (tests/flows/grids.GRID, one worker per rank,
    as the clean run), started in its own session (on the Prefect server ``api_url``, or, if
    None, a temporary one of its own); returns it and its arguments, once it has written two
    checkpoints (mid-grid, with work done and work left)."""
    args = [sys.executable, "-m", "damptune", "tune", "--networks", "2", "--algorithms",
            "geodamp,padadamp", "--models", "mlp", "--trials", "3", "--epochs", "3",
            "--target", "0.45", "--validation-seeds", "0", "--workers-per-trial", "0",
            "--grid-name", "g", "--run-dir", str(run_dir),
            "--checkpoint-seconds", "3600", "--checkpoint-every", str(EVERY), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update({"DAMPTUNE_LEASE_TTL": "4"}, **({"PREFECT_API_URL": api_url} if api_url else {}))
    # SIGINT at its default, as a terminal starts it, whatever this process's is
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True, preexec_fn=_default_sigint)
    ckpts = run_dir / "checkpoints"

    def mid_grid():
        return ckpts.exists() and len(list(ckpts.rglob("*.pt"))) >= 2

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not mid_grid():
        time.sleep(0.2)
    if not mid_grid():
        os.killpg(proc.pid, signal.SIGKILL)  # not mid-grid: the fault would test nothing
        pytest.fail(f"`damptune tune` wrote fewer than 2 checkpoints in 300 s ({ckpts})")
    return proc, args, env


def test_sigterm_to_damptune_tune_exits_75_then_a_rerun_equals_the_clean_run(
        tmp_path, clean, prefect_harness):
    """A real SIGTERM to the `damptune tune` process mid-grid (what a spot machine's shutdown
    sends): its trials checkpoint, it exits 75 (EX_TEMPFAIL: run it again), and a rerun ends
    equal to the clean run, one MLflow run per trial, some trial resumed."""
    run_dir = tmp_path / "t"
    proc, args, env = _tune_process(run_dir, prefect_harness)
    assert proc.poll() is None, "the grid ended before the signal"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(300) == 75
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}
    assert any(w["attempts"] == 2 for w in worklog.summary(str(run_dir)).values())


def test_ctrl_c_to_damptune_tune_exits_75_then_a_rerun_equals_the_clean_run(tmp_path, clean):
    """Ctrl-C in the terminal of a `damptune tune` that names no Prefect server: SIGINT to its
    whole process group, its Dask workers too. The first Ctrl-C asks the stop, as a SIGTERM
    does: the trials whose workers died end at their last synced update instead of waiting
    for replacements that never come (600 s per trial, before), the run's own temporary
    Prefect server (in a session of its own) takes the run's last calls, and the run exits 75
    and stops that server. A rerun ends equal to the clean run, one MLflow run per trial."""
    run_dir = tmp_path / "c"
    proc, args, env = _tune_process(run_dir, None)
    try:
        assert proc.poll() is None, "the grid ended before the signal"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(300) == 75
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    server = _server_of(proc.pid)
    assert server is None and (run_dir / "prefect-server.log").exists(), server
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}
    assert any(w["attempts"] == 2 for w in worklog.summary(str(run_dir)).values())


def test_sigkill_of_the_flow_process_then_rerun(tmp_path, clean, prefect_harness):
    """Fault injection: SIGKILL `damptune tune` mid-grid, rerun it: every trial finished
    exactly once in Optuna, one MLflow run per trial, values equal to the clean run's."""
    run_dir = tmp_path / "k"
    proc, args, env = _tune_process(run_dir, prefect_harness)
    os.killpg(proc.pid, signal.SIGKILL)  # the flow process and its Dask workers
    proc.wait(30)
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}
    # lost work: the trial(s) training at the kill resumed from their last checkpoint and
    # redid at most one interval (EVERY updates)
    work = worklog.summary(str(run_dir))
    assert any(w["attempts"] == 2 for w in work.values()), work
    assert all(w["attempts"] <= 2 and w["max_lost_updates"] <= EVERY
               for w in work.values()), work
    report = subprocess.run([sys.executable, "-m", "damptune", "report", "--run-dir",
                             str(run_dir), "--json"], capture_output=True, text=True,
                            timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    rows = [json.loads(line) for line in report.stdout.splitlines()]
    # one row per algorithm of the grid's one (network, model) pair, every trial finished
    assert sorted(r["algorithm"] for r in rows) == ["geodamp", "padadamp"], rows
    assert all(r["n_complete"] + r["n_pruned"] == 3 for r in rows), rows
    assert all(r["n_interrupted"] == 0 and r["n_failed"] == 0 for r in rows)


def test_mlflow_outage_stops_the_grid_with_a_clear_error_then_rerun(tmp_path, scheduler,
                                                                     clean, monkeypatch):
    """MLflow's server dies mid-grid (SIGKILL): the trials in flight stop *interrupted* once
    the bounded retries are spent, the flow run fails with an error that says so, and nothing
    is lost: after the server is back, a rerun ends equal to the clean run, with one MLflow run
    per trial on the server."""
    from infra.stack import free_port

    # MLflow's own retries of one request, shortened (tasks.tracking.client_for keeps a value
    # that is set): a refused connection then fails at once, and the pipeline's own 4 attempts
    # (tasks.tracking.with_retries, asserted below) are what the outage goes through
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")

    port, root = free_port(), tmp_path / "mlflow"
    uri = f"http://127.0.0.1:{port}"
    server = mlflow_server(root, port)
    run_dir = str(tmp_path / "r")
    storage = f"sqlite:///{run_dir}/optuna.db"

    watcher = after_first_finished_trial(storage,
                                         lambda: os.killpg(server.pid, signal.SIGKILL))
    try:
        with pytest.raises(Exception, match="MLflow did not answer after 4 attempts") as failed:
            tune(grid_name="g", run_dir=run_dir, cluster=scheduler, tracking_uri=uri, **GRID)
        assert "Nothing was lost" in str(failed.value)
        watcher.join()
        assert watcher.landed, watcher.trial  # the server died while a trial trained
        before = trials_of(run_dir, "g")
        assert all(state != "FAIL" for trials in before.values() for _, state, _, _ in trials)
        server = mlflow_server(root, port)  # back, on the same store
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, tracking_uri=uri, **GRID)
        assert trials_of(run_dir, "g") == clean
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("damptune-g")
        runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'",
                                  max_results=1000)
        keys = [(r.data.tags["damptune.cell"], r.data.tags["damptune.trial_number"])
                for r in runs]
        # every trial of the clean grid, once each
        n_trials = sum(len(t) for t in clean.values())
        assert len(keys) == n_trials and len(set(keys)) == n_trials
        assert {r.info.status for r in runs} == {"FINISHED"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
