"""``workers_per_trial``: a trial's P ranks on fewer Dask workers (each taking several ranks'
shares of the batch) trains the same trials to the same values, on the workers it says."""

import pytest
from distributed import Client, get_task_stream

from damptune import ConfigError
from flows.tune import grid_of, tune
from tests.flows.grids import trials_of
from tests.flows.test_tune import mlflow_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

GRID = dict(networks=[4], algorithms=["geodamp"], models=["mlp"], trials=2, epochs=2,
            target_accuracy=0.3, pruner="none", validation_seeds=0)


def _grid(tmp_path, scheduler, folder, workers):
    """The grid (one name: the same sampled trials) in its own run directory."""
    run_dir, name = str(tmp_path / folder), "w"
    with Client(scheduler, set_as_default=False) as client, get_task_stream(client) as stream:
        tune(grid_name=name, run_dir=run_dir, cluster=scheduler, workers_per_trial=workers,
             **GRID)
    ran_on = {t["worker"] for t in stream.data if t.get("worker")}
    _, runs = mlflow_runs(run_dir, name)
    logged = {r.data.params.get("dask_workers") for r in runs
              if r.data.tags.get("damptune.kind") == "trial"}
    return trials_of(run_dir, name)["n4/geodamp/mlp"], ran_on, logged


def test_workers_per_trial_trains_p_ranks_on_fewer_workers_to_the_same_values(
        tmp_path, scheduler):
    every, ran_every, logged_every = _grid(tmp_path, scheduler, "every", 0)
    one, ran_one, logged_one = _grid(tmp_path, scheduler, "one", 1)
    assert len(ran_every) == 4 and len(ran_one) == 1  # the scheduler's record of the tasks
    assert logged_every == {"4"} and logged_one == {"1"}
    assert [t[1] for t in one] == [t[1] for t in every] == ["COMPLETE", "COMPLETE"]
    assert [t[2] for t in one] == [t[2] for t in every]  # the same sampled trials
    assert [t[3] for t in one] == pytest.approx([t[3] for t in every], rel=1e-6)


@pytest.mark.parametrize(("params", "cores", "expected"), [
    (dict(cluster="local"), 16, 8),  # the cores shared by the two cells that train at once
    (dict(cluster="local"), 3, 1),
    (dict(cluster="local"), 1, 1),  # never 0: at least one worker
    (dict(cluster="local"), None, 1),  # os.cpu_count() could not tell
    (dict(cluster="local", max_concurrent_cells=4), 16, 4),
    (dict(cluster="local", max_concurrent_cells=2, max_concurrent_trials=2), 16, 4),
    (dict(cluster="tcp://127.0.0.1:1"), 16, 0),
    (dict(cluster="local", mode="decentralized"), 16, 0),
    (dict(cluster="local", workers_per_trial=3), 16, 3),
])
def test_workers_per_trial_default_follows_the_cluster(params, cores, expected, monkeypatch):
    """On a machine of ``cores`` cores (as ``os.cpu_count`` tells it)."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    settings, _ = grid_of(params)
    assert settings.workers_per_trial == expected


@pytest.mark.parametrize(("params", "words"), [
    (dict(workers_per_trial=-1), "an integer >= 0"),
    (dict(workers_per_trial=1.5), "an integer >= 0"),
    (dict(workers_per_trial=2, mode="decentralized"), "needs a worker per rank"),
])
def test_workers_per_trial_bad_values_are_refused_naming_it(params, words):
    with pytest.raises(ConfigError, match="workers_per_trial") as info:
        grid_of(params)
    assert words in str(info.value)
