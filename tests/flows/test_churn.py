"""Spot clusters replace machines: the grid follows the live cluster, and no fault of the
cluster becomes a FAIL (real Prefect harness, Optuna and MLflow on SQLite, real Dask
LocalClusters whose worker processes are killed by real signals)."""

import json
import logging
import os
import re
import signal
import threading

import pytest
import yaml
from distributed import Client, WorkerPlugin
from mlflow.tracking import MlflowClient

from damptune import ConfigError, load_checkpoint
from damptune.checkpoint import checkpoint_exists, checkpoint_paths
from damptune.cluster import local_cluster
from flows.tune import tune
from infra.stack import REPO_ROOT, free_port
from tasks import worklog
from tasks.grid import Cell, GridSettings, checkpoint_path
from tasks.report import GridIncomplete
from tests.flows.grids import (
    GRID,
    after_first_finished_trial,
    runs_per_trial,
    trials_of,
    while_a_trial_trains,
)
from tests.segments import act_inside_a_segment

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

EVERY = 30  # updates between checkpoints of the spot-kill grid (not by time: a count)
SPOT_GRID = {**GRID, "checkpoint_seconds": 3600.0, "checkpoint_every": EVERY}


@pytest.fixture
def spot_cluster(tmp_path):
    """A cluster of the grid's size (2 workers): killed workers are restarted by their
    nannies, at new addresses."""
    cluster = local_cluster(n_workers=2, local_directory=str(tmp_path / "dask"))
    yield cluster
    cluster.close()


def sigkill(address, pick):
    def kill():
        with Client(address, timeout="10s") as client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
            pids = client.run(os.getpid, workers=pick(workers))
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        kill.done = sorted(pids)

    kill.done = []
    return kill


def kill_in_the_second_training(monkeypatch, kill):
    """Have ``kill`` run inside the grid's second training (one trial trains at a time on the
    grid's 2 workers, so the first has ended), inside its first segment: after the ranks' tasks
    were submitted, before their results are awaited, so the segment loses its worker however
    fast or loaded the machine. (A kill from a trial callback, between two segments, missed
    the trial whenever its training was one segment: fast days; a thread that polled the
    storage could fire after the last segment, while the trial was still RUNNING.)"""
    import threading

    import tasks.trial

    real_callbacks, trainings, armed = tasks.trial.trial_callbacks, [], []

    def counted(**kw):  # called by the trial's thread, which then trains
        trainings.append(None)
        if len(trainings) == 2:
            armed.append(threading.get_ident())
        return real_callbacks(**kw)

    monkeypatch.setattr(tasks.trial, "trial_callbacks", counted)
    act_inside_a_segment(monkeypatch, lambda: threading.get_ident() in armed, kill)


def kill_two_intervals_into_the_second_training(monkeypatch, kill, run_dir):
    """Have ``kill`` run inside the grid's second training, inside the first segment that
    starts once its work log shows it past two checkpoint intervals (more than 2 × EVERY
    updates), so its checkpoints hold two generations. Returns what the trial's work log and
    checkpoints held then, filled in at the kill: its driver's thread, its cell and number,
    its latest update (the work log's live line) and the updates of its two newest
    checkpoints (None where there is none)."""
    import tasks.trial

    real_callbacks, trainings, logs, killed = tasks.trial.trial_callbacks, [], {}, {}

    def counted(**kw):  # called by the trial's thread, which then trains
        trainings.append(None)
        if len(trainings) == 2:
            logs[threading.get_ident()] = kw["worklog"]
        return real_callbacks(**kw)

    def armed():
        log = logs.get(threading.get_ident())
        return log is not None and live_update(log) > 2 * EVERY

    def act():
        log = logs[threading.get_ident()]
        cell = os.path.relpath(os.path.dirname(log.live_path), os.path.join(run_dir, "worklog"))
        number = int(os.path.basename(log.live_path).removeprefix("trial-").split(".")[0])
        path = checkpoint_path(GridSettings(run_dir=run_dir, grid_name="g"),
                               Cell.from_key(cell), number)
        killed.update(thread=threading.get_ident(), cell=cell, number=number,
                      update=live_update(log),
                      checkpoints=[load_checkpoint(p)["counters"]["update"]
                                   if checkpoint_exists(p) else None
                                   for p in checkpoint_paths(path, 2)])
        kill()

    monkeypatch.setattr(tasks.trial, "trial_callbacks", counted)
    act_inside_a_segment(monkeypatch, armed, act)
    return killed


def live_update(log):
    """The latest update in a trial's live work-log line (``tasks/worklog.py``); 0 if none."""
    try:
        with open(log.live_path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def went_back_to(killed, caplog, run_dir):
    """The update the killed trial trained on from: where its driver re-formed the ranks'
    group (damptune/segments.py logs it, first in the trial's thread after the kill), or
    where its next attempt resumed (its work log), whichever is earlier."""
    regrouped = [int(m.group(1)) for r in caplog.records if r.thread == killed["thread"]
                 and (m := re.search(r"re-forming the group from update (\d+)", r.getMessage()))]
    log = worklog.WorkLog(run_dir, killed["cell"], killed["number"])
    with open(log.attempts_path) as f:
        resumed = [json.loads(line)["resumed_at"] for line in f if line.strip()][1:]
    assert regrouped or resumed, "the killed trial neither re-formed its group nor resumed"
    return min(regrouped[:1] + resumed)


def assert_killed_inside_a_trial(kill, n_killed, caplog, run_dir):
    """The kill happened, hit ``n_killed`` workers, and landed inside a trial, which went on:
    its driver re-formed the ranks' group from its last synced update (damptune/segments.py
    logs it) or the trial was retried (a second attempt in its work log). A kill between two
    trials does neither."""
    assert len(kill.done) == n_killed, kill.done  # really killed
    regrouped = [r.getMessage() for r in caplog.records
                 if r.name == "damptune.segments" and r.getMessage().startswith("lost a rank")]
    retried = {k: w for k, w in worklog.summary(run_dir).items() if w["attempts"] >= 2}
    assert regrouped or retried, "no trial lost a rank or was retried: the kill missed them"


@pytest.mark.parametrize("victims", ["one worker", "every worker"])
def test_workers_sigkilled_mid_grid_lose_nothing(tmp_path, spot_cluster, clean, victims,
                                                 caplog, monkeypatch):
    """The issue's scenario: worker processes SIGKILLed after the first trial finished, while
    another trains, two checkpoint intervals into it; their nannies start replacements at new
    addresses. The trial that lost its workers went on and lost at most one checkpoint
    interval: the updates it trained again (its work log's latest update at the kill, less
    the update it went back to) are at most the updates between its two newest checkpoints
    then, which are the configured interval. The grid ends as the clean run did: every trial
    COMPLETE or PRUNED once, none FAIL, the same values, one MLflow run per trial."""
    run_dir = str(tmp_path / "r")
    pick = (lambda ws: ws[:1]) if victims == "one worker" else (lambda ws: ws)
    kill = sigkill(spot_cluster.scheduler_address, pick)
    killed = kill_two_intervals_into_the_second_training(monkeypatch, kill, run_dir)
    with caplog.at_level(logging.WARNING, logger="damptune.segments"):
        rows = tune(grid_name="g", run_dir=run_dir, cluster=spot_cluster.scheduler_address,
                    **SPOT_GRID)
    assert_killed_inside_a_trial(kill, 1 if victims == "one worker" else 2, caplog, run_dir)
    newest, previous = killed["checkpoints"]
    redone = killed["update"] - went_back_to(killed, caplog, run_dir)
    interval = None if None in (newest, previous) else newest - previous
    assert interval == EVERY, (interval, redone, killed)  # as its checkpoints record it
    assert 0 <= redone <= interval, (redone, killed)
    assert all(r["n_failed"] == 0 and r["n_interrupted"] == 0 for r in rows)
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}


def test_a_grid_on_a_spec_cluster_from_yaml_survives_a_killed_worker(tmp_path, clean, caplog,
                                                                      monkeypatch):
    """A cluster class other than LocalCluster, loaded from YAML as a user would load theirs:
    distributed's SpecCluster (the base of dask-jobqueue's and dask-kubernetes' clusters) from
    infra/cluster-spec.yaml, given a known port. A worker SIGKILLed mid-trial is replaced by
    its nanny; the trial goes on and the grid ends equal to the clean run."""
    with open(os.path.join(REPO_ROOT, "infra", "cluster-spec.yaml")) as f:
        spec = yaml.safe_load(f)
    port = spec["kwargs"]["scheduler"]["options"]["port"] = free_port()
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    run_dir = str(tmp_path / "y")
    kill = sigkill(f"tcp://127.0.0.1:{port}", lambda ws: ws[:1])
    kill_in_the_second_training(monkeypatch, kill)
    with caplog.at_level(logging.WARNING, logger="damptune.segments"):
        rows = tune(grid_name="g", run_dir=run_dir, cluster=str(path), **GRID)
    assert_killed_inside_a_trial(kill, 1, caplog, run_dir)
    assert all(r["n_failed"] == 0 and r["n_interrupted"] == 0 for r in rows)
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}
    with pytest.raises(OSError):  # the cluster the flow opened from the YAML is closed
        Client(f"tcp://127.0.0.1:{port}", timeout="2s")


def test_workers_gone_for_good_stop_the_cell_interrupted_then_a_rerun_finishes(
        tmp_path, spot_cluster, scheduler, clean, caplog):
    """A fault that never ends: after the first trial, while another trains, the cluster
    scales to no workers (its machines are gone and none come back). Each trial waits
    ``worker_wait`` for workers in each of its ``trial_attempts`` (the one training at the
    loss too: not the engine's 300 s rank timeout), then its cell stops with
    TrialsInterrupted: the grid ends incomplete with that error, not as bad input, and no
    Optuna trial is FAIL. A rerun on a healthy cluster finishes the grid, equal to the clean
    run, one MLflow run per trial."""
    caplog.set_level(logging.WARNING)
    run_dir = str(tmp_path / "g")
    watcher = while_a_trial_trains(f"sqlite:///{run_dir}/optuna.db", run_dir,
                                   lambda: spot_cluster.scale(0))
    with pytest.raises(GridIncomplete) as stopped:
        tune(grid_name="g", run_dir=run_dir, cluster=spot_cluster.scheduler_address,
             trial_attempts=2, worker_wait=2.0, **GRID)
    watcher.join()
    assert not isinstance(stopped.value, ConfigError)
    failures = stopped.value.failures
    assert failures and all("interrupted by faults of the cluster in all 2 attempts" in f
                            and "Nothing was lost" in f for f in failures), failures
    # every attempt of every trial ended by waiting worker_wait (2 s) for workers, or at once
    # when its workers left between being taken and its training's start (the scale-down
    # can land there); never by the engine's rank timeout. Each trial's last attempt waited.
    ends = [r.getMessage() for r in caplog.records if " interrupted: cluster fault" in
            r.getMessage()]
    waited = [m for m in ends if "(waited 2 s)" in m]
    assert all(m in waited or "are no longer in the cluster" in m for m in ends), ends
    assert len(waited) >= len(failures) >= 1, ends
    before = trials_of(run_dir, "g")
    states = [state for trials in before.values() for _, state, _, _ in trials]
    assert "FAIL" not in states and "RUNNING" in states, before
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    assert trials_of(run_dir, "g") == clean
    assert set(runs_per_trial(run_dir, "g").values()) == {1}


class RanksPerWorker(WorkerPlugin):
    """Counts the ranks each worker joined (``rank_setup`` tasks)."""

    name = "ranks-per-worker"

    def setup(self, worker):
        self.ranks = 0

    def transition(self, key, start, finish, **kwargs):
        if finish == "memory" and str(key).startswith("rank_setup-"):
            self.ranks += 1


def test_workers_added_mid_grid_are_used(tmp_path, spot_cluster):
    """The cluster is scaled from 2 to 4 workers mid-grid (as an adaptive cluster or a new
    spot machine would): the new workers train trials, and every trial finishes."""
    run_dir = str(tmp_path / "s")
    with Client(spot_cluster.scheduler_address, timeout="10s") as client:
        client.register_plugin(RanksPerWorker())
        first = set(client.scheduler_info(n_workers=-1)["workers"])
    watcher = after_first_finished_trial(f"sqlite:///{run_dir}/optuna.db",
                                         lambda: spot_cluster.scale(4))
    rows = tune(grid_name="g", run_dir=run_dir, cluster=spot_cluster.scheduler_address,
                max_concurrent_cells=2, **{**GRID, "trials": 4})
    watcher.join()
    assert all(r["n_complete"] + r["n_pruned"] == 4 for r in rows), rows
    with Client(spot_cluster.scheduler_address, timeout="10s") as client:
        ranks = client.run(lambda dask_worker: dask_worker.plugins["ranks-per-worker"].ranks)
    added = {w: n for w, n in ranks.items() if w not in first}
    assert len(added) == 2 and all(n > 0 for n in added.values()), ranks


def test_a_configuration_error_fails_at_once_with_its_message(tmp_path, scheduler):
    """A genuine configuration error (checkpoint_root is a file, so no checkpoint can be
    written) is not retried: every trial is FAIL after one attempt, with the message in
    Optuna, its MLflow run FAILED, and the run is not a success (exit code 1)."""
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    run_dir = str(tmp_path / "f")
    with pytest.raises(GridIncomplete, match="2 trial\\(s\\) FAIL") as failed:
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, checkpoint_root=str(not_a_dir),
             **{**GRID, "algorithms": ["geodamp"], "trials": 2})
    assert failed.value.exit_code == 1
    import optuna

    study = optuna.load_study(study_name="g/n2/geodamp/mlp",
                              storage=f"sqlite:///{run_dir}/optuna.db")
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    assert all("Not a directory" in t.user_attrs["fail_reason"] for t in study.trials)
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    exp = client.get_experiment_by_name("damptune-g")
    runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'")
    assert sorted(r.info.status for r in runs) == ["FAILED", "FAILED"]
    assert set(runs_per_trial(run_dir, "g").values()) == {1}
