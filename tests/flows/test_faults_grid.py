"""Faults a grid meets between two checks, with real components (Prefect harness, Optuna and
MLflow on SQLite, real Dask clusters, real signals): a worker that leaves as Dask looks it up,
and a cluster whose ``max_cluster_lifetime`` is reached while a trial trains."""

import dataclasses
import json
import logging
import os
import signal
import time

import pytest
from distributed import Client
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

from damptune import load_checkpoint
from damptune.cluster import local_cluster
from damptune.interrupt import parse_duration
from damptune.segments import SegmentRunner
from flows.tune import tune
from tasks import worklog
from tasks.grid import Cell, GridSettings, checkpoint_path
from tasks.report import GridIncomplete
from tasks.session import lifetime_deadline
from tests.flows.grids import GRID, live_update, runs_per_trial, trials_of
from tests.segments import act_inside_a_segment

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

CELL = "n2/geodamp/mlp"
# one search trial of one cell of the fault tests' grid: its trial 0 is the clean run's
# (a cell's trials depend on its own study only: no neighbour seeds a lone network size)
ONE_TRIAL = {**GRID, "algorithms": ["geodamp"], "trials": 1, "validation_seeds": 0}
LEAD = 20.0  # s from the call to the lifetime's deadline: well past a warm grid's first update


@pytest.fixture
def two_workers(tmp_path):
    """A cluster of the grid's size whose killed workers are restarted by their nannies."""
    cluster = local_cluster(n_workers=2, local_directory=str(tmp_path / "dask"))
    yield cluster
    cluster.close()


def kill_at_the_first_scatter(monkeypatch, address):
    """SIGKILL rank 0's worker once, as the first training sends the data to its ranks
    (``client.scatter(..., broadcast=True)``), and let the scatter go on once the scheduler
    has dropped that worker: Dask then raises a KeyError naming it, as it does when a worker
    dies between being chosen and being looked up. (A fault inside a training segment does
    not reach the trial: the engine re-forms the ranks' group itself.) The killed address is
    kept in the returned list."""
    real_scatter, killed = SegmentRunner._scatter, []

    def scatter(self):
        if not killed:
            victim = self.group.addresses[0]
            with Client(address, timeout="10s") as client:
                pid = client.run(os.getpid, workers=[victim])[victim]
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 60
                while victim in client.scheduler_info(n_workers=-1)["workers"]:
                    assert time.monotonic() < deadline, f"{victim} never left the scheduler"
                    time.sleep(0.05)
            killed.append(victim)
        return real_scatter(self)

    monkeypatch.setattr(SegmentRunner, "_scatter", scatter)
    return killed


def test_a_worker_gone_as_dask_looks_it_up_is_retried_and_the_trial_completes(
        tmp_path, two_workers, clean, monkeypatch, caplog):
    """The scheduler is asked about a worker that has just died and raises a KeyError naming
    its address: a fault of the cluster, not of the trial. The trial is interrupted and
    retried by the same run on the live workers (the nanny's replacement), and ends COMPLETE
    with the clean run's value: no FAIL, one MLflow run, FINISHED, and no Failed task run in
    Prefect (the trial returns its interruption; the cell's check of what a trial raises is
    a second line behind it)."""
    caplog.set_level(logging.WARNING)
    run_dir = str(tmp_path / "k")
    killed = kill_at_the_first_scatter(monkeypatch, two_workers.scheduler_address)
    rows = tune(grid_name="g", run_dir=run_dir, cluster=two_workers.scheduler_address,
                **ONE_TRIAL)
    assert len(killed) == 1, "the first training never sent its data"
    interrupted = [r.getMessage() for r in caplog.records
                   if f"trial 0 of {CELL} interrupted: cluster fault: '{killed[0]}'"
                   in r.getMessage()]
    assert interrupted, [r.getMessage() for r in caplog.records]  # the KeyError, retried
    assert [(r["n_complete"], r["n_failed"], r["n_interrupted"]) for r in rows] == [(1, 0, 0)]
    assert clean[CELL][0][1] == "COMPLETE"
    assert trials_of(run_dir, "g") == {CELL: clean[CELL][:1]}
    assert runs_per_trial(run_dir, "g") == {(CELL, "0"): 1}
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    exp = client.get_experiment_by_name("damptune-g")
    runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'")
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert task_run_states(run_dir, f"{CELL}/trial-0") == ["Completed", "Completed"]


def task_run_states(run_dir, name):
    """The Prefect states of the task runs called ``name`` of the flow run that wrote
    ``run_dir`` (as its UI lists them), oldest first."""
    with get_client(sync_client=True) as prefect:
        runs = prefect.read_task_runs(task_run_filter=TaskRunFilter(
            name=TaskRunFilterName(any_=[name])))
        ours = [r for r in runs
                if prefect.read_flow_run(r.flow_run_id).parameters.get("run_dir") == run_dir]
    return [r.state_name for r in sorted(ours, key=lambda r: r.expected_start_time)]


def lifetime_due_at(started, due, settings):
    """The ``max_cluster_lifetime`` text whose deadline (:func:`lifetime_deadline`, what the
    flow computes) is ``due``, for a cluster started at ``started``: found by bisection on
    the product's own function, which grows with the lifetime."""
    low, high = 1.0, 2 * (due - started) + 1e4
    for _ in range(80):
        mid = (low + high) / 2
        at = lifetime_deadline(started, dataclasses.replace(settings, max_cluster_lifetime=mid))
        low, high = (mid, high) if at < due else (low, mid)
    return f"{high:.3f}s"


def test_a_lifetime_reached_mid_trial_checkpoints_and_stops_it_then_a_rerun_resumes_it(
        tmp_path, scheduler, clean, monkeypatch, caplog):
    """``max_cluster_lifetime``'s deadline lands while a trial trains: the trial checkpoints
    at its next boundary and stops, interrupted (Optuna RUNNING, exit status 75, no FAIL);
    it stops at the checkpoint it wrote, nothing trained past it. A rerun resumes it from
    that checkpoint (its work log: a second attempt from the same update, > 0, nothing
    lost), and the grid ends equal to the clean run, one MLflow run per trial.

    The deadline is set ``LEAD`` s ahead; the driver of the first training waits for it
    inside its first segment (the ranks train that segment meanwhile), so it lands there
    however fast the machine. The grid checkpoints every 20 updates, so that segment ends
    well before the trial's end (its ~150+ updates)."""
    caplog.set_level(logging.WARNING)
    grid = {**ONE_TRIAL, "checkpoint_every": 20}
    with Client(scheduler, timeout="10s") as client:
        started = client.scheduler_info(n_workers=0)["started"]
    lifetime = lifetime_due_at(started, time.time() + LEAD,
                               GridSettings(checkpoint_seconds=grid["checkpoint_seconds"]))
    settings = GridSettings(max_cluster_lifetime=parse_duration(lifetime),
                            checkpoint_seconds=grid["checkpoint_seconds"])
    deadline = lifetime_deadline(started, settings)

    def until_the_deadline():
        while time.time() < deadline:  # bounded: the deadline is LEAD s from the call
            time.sleep(0.05)

    act_inside_a_segment(monkeypatch, lambda: True, until_the_deadline)
    run_dir = str(tmp_path / "l")
    with pytest.raises(GridIncomplete, match="interrupted") as stopped:
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, max_cluster_lifetime=lifetime,
             **grid)
    assert stopped.value.exit_code == 75 and not stopped.value.failures
    assert [(n, state) for n, state, _, _ in trials_of(run_dir, "g")[CELL]] == [(0, "RUNNING")]
    assert any(f"trial 0 of {CELL} interrupted" in r.getMessage()
               and "the cluster's lifetime limit is near" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    first = worklog.summary(run_dir)
    assert first.get((CELL, 0), {}).get("attempts") == 1, (
        f"the trial did not train before the deadline (the grid took over {LEAD} s to "
        f"start): {first}")
    ckpt = checkpoint_path(GridSettings(run_dir=run_dir, grid_name="g"), Cell.from_key(CELL), 0)
    at = load_checkpoint(ckpt)["counters"]["update"]
    assert 0 < at <= 20, at  # stopped mid-trial, at its first boundary past the deadline
    # it stopped at that checkpoint: no update trained past it (the margin that puts the
    # checkpoint before the lifetime's end is tests/tasks/test_lifetime.py's)
    assert live_update(worklog.WorkLog(run_dir, CELL, 0).live_path) == at

    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **grid)
    assert trials_of(run_dir, "g") == {CELL: clean[CELL][:1]}
    assert runs_per_trial(run_dir, "g") == {(CELL, "0"): 1}
    with open(worklog.WorkLog(run_dir, CELL, 0).attempts_path) as f:
        attempts = [line for line in f if line.strip()]
    second = json.loads(attempts[1])
    assert len(attempts) == 2 and second["resumed_at"] == at and second["lost_updates"] == 0
