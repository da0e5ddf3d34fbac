"""A training reused across network sizes (tasks.reuse): a trial whose batches fitted a smaller
network's cap takes that training's result instead of training again, and the result is the
one training it on its own network gives."""

import optuna
import pytest
from distributed import Client

from damptune import TrainData, train
from flows.tune import grid_of, tune
from models import load_dataset
from tasks.callbacks import CalibrationKeeper
from tasks.grid import Cell, GridSettings
from tasks.objective import objective
from tasks.reuse import REUSED_ATTR, TRAINING_ATTR
from tasks.search import open_study
from tasks.trial import trial_config
from tasks.validation import sources_of, validation_settings
from tests.flows.test_tune import mlflow_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

GRID = dict(networks=[2, 4], algorithms=["geodamp"], models=["mlp"], trials=4, epochs=3,
            target_accuracy=0.45, validation_seeds=3, grid_name="r")


def _complete(run_dir):
    storage = f"sqlite:///{run_dir}/optuna.db"
    out = {}
    for s in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        out.update({(s.study_name, t.number): t for t in study.trials
                    if t.state.name == "COMPLETE"})
    return out


def _network(study_name):
    return Cell.from_key(study_name.split("/", 1)[1]).network


def _trained_alone(settings, cells, scheduler, trial, study_name):
    """The objective of ``trial``'s configuration trained now as its cell trains (its network,
    stage, settings, data and stored calibration), on as many workers as the grid's trial
    had."""
    cell, seed = Cell.from_key(study_name.split("/", 1)[1]), trial.user_attrs.get("train_seed")
    ds = load_dataset(settings.dataset, seed=settings.data_seed_of(cell, seed))
    keeper = CalibrationKeeper(open_study(settings, cell.searched, n_train=len(ds.y_train)))
    if cell.stage != "search":  # a held-out seed's: the held-out cell's settings
        settings = GridSettings(**validation_settings(
            settings, sources=sources_of(cell, cells), stage=cell.stage))
    config = keeper.stored(trial_config(settings, cell, trial.params, ds, seed=seed))
    with Client(scheduler, timeout="10s") as client:
        workers = sorted(client.scheduler_info()["workers"])
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    state = train(config, data, cluster=scheduler, workers=workers[:settings.trial_workers(
        cell.network)])
    return objective(state.history, target=settings.target_of(cell))[0]


def test_a_training_that_fits_a_smaller_cap_is_reused_with_the_value_it_would_train_to(
        tmp_path, scheduler):
    run_dir = str(tmp_path / "r")
    tune(run_dir=run_dir, cluster=scheduler, **GRID)
    settings, cells = grid_of({**GRID, "run_dir": run_dir})
    trials = _complete(run_dir)
    reused = {k: t for k, t in trials.items() if REUSED_ATTR in t.user_attrs}
    assert reused, "no trial reused a training"
    for (study, _), t in reused.items():
        source_study, number = t.user_attrs[REUSED_ATTR].rsplit("#", 1)
        source, network = trials[(source_study, int(number))], _network(study)
        assert source.params == t.params and t.value == source.value
        assert source.user_attrs.get("train_seed") == t.user_attrs.get("train_seed")
        assert source.user_attrs[TRAINING_ATTR]["ranks"] <= min(network, _network(source_study))
        assert t.intermediate_values == source.intermediate_values
        # the value it took is the one its own training on its network gives, to the last bit
        assert _trained_alone(settings, cells, scheduler, t, study) == t.value, (study, t.number)
    # the trainings of n2 its cap cut (tests/damptune/test_least_cap.py) are not reusable
    assert any(TRAINING_ATTR not in t.user_attrs for (s, _), t in trials.items()
               if s.startswith("r/n2/"))

    client, runs = mlflow_runs(run_dir, "r")
    by_id = {r.info.run_id: r for r in runs}
    reused_runs = [r for r in runs if "damptune.reused_from" in r.data.tags]
    assert len(reused_runs) == len(reused)
    for run in reused_runs:
        source = by_id[run.data.tags["damptune.reused_from"]]
        assert run.info.status == "FINISHED" and run.data.tags["damptune.state"] == "COMPLETE"
        assert run.data.metrics["objective"] == source.data.metrics["objective"]
        assert run.data.params["hp.factor"] == source.data.params["hp.factor"]
        if run.data.tags["damptune.stage"] == "search":  # a search trial's plots, copied
            assert client.list_artifacts(run.info.run_id, "plots"), run.data.tags
    assert any(r.data.tags["damptune.stage"] == "search" for r in reused_runs)
