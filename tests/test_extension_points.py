"""The extension points of CONTRIBUTING.md, each added the way it says and then used.

- a damper: one class and one ``DAMPERS`` entry (here the class lives in tests/extensions.py and
  the entry is set by the test), then tuned by the grid and trained by the engine;
- a model: one module and one ``MODELS`` entry, then trained through a grid's trial config;
- a trial callback: one class and one entry in ``tasks.trial.trial_callbacks``, then fed by a
  real grid's trial.
"""

from __future__ import annotations

import numpy as np
import optuna
import pytest

import tasks.trial
from damptune import DAMPERS, EvalRecord, Record, TrainConfig, TrainData, UpdateRecord, train
from flows.tune import tune
from models import MODELS, load_dataset
from tasks.grid import GridSettings, cells_of
from tasks.search import distributions
from tests.extensions import DoublingDamp, TinyNet


def test_a_damper_added_in_one_place_is_tuned_and_trained(monkeypatch):
    monkeypatch.setitem(DAMPERS, DoublingDamp.name, DoublingDamp)
    settings = GridSettings(epochs=2, per_worker_batch=16)
    (cell,) = cells_of(networks=[2], algorithms=["doublingdamp"], models=["mlp"],
                       settings=settings)
    assert set(distributions(settings, cell)) == {"every"}  # its declared search space
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(256, 4)).astype("float32"), rng.integers(0, 2, 256)
    config = TrainConfig(module="torch.nn:Linear", module_kwargs={"in_features": 4,
                         "out_features": 2}, damper="doublingdamp",
                         damper_kwargs={"initial": 4, "every": 2}, max_batch_size=16,
                         max_updates=8, max_epochs=10)
    state = train(config, TrainData.from_arrays(X, y))
    sizes = [r["batch_size"] for r in state.history if r["kind"] == "update"]
    assert sizes == [4, 4, 8, 8, 16, 16, 16, 16]  # doubles every 2 updates, up to the cap


def test_a_model_added_in_the_registry_trains_in_a_grid_trial(monkeypatch):
    monkeypatch.setitem(MODELS, "tiny", TinyNet)
    settings = GridSettings(epochs=1, target_accuracy=0.5, per_worker_batch=32)
    (cell,) = cells_of(networks=[1], algorithms=["geodamp"], models=["tiny"], settings=settings)
    assert settings.trials_for("tiny") == 8  # the default trials name mlp, cnn, wrn16_4 only
    ds = load_dataset("synthetic", seed=0)
    config = tasks.trial.trial_config(settings, cell, {"factor": 2.0, "delay": 1}, ds)
    config.mode = "local"
    state = train(config, TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test))
    assert type(state.model) is TinyNet
    assert [r["kind"] for r in state.history].count("eval") >= 1


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_trial_callback_added_to_the_list_sees_every_record(tmp_path, monkeypatch):
    seen: list[Record] = []

    class Recorder:
        def __call__(self, record: Record) -> None:
            seen.append(record)

    real = tasks.trial.trial_callbacks
    monkeypatch.setattr(tasks.trial, "trial_callbacks",
                        lambda **kw: [*real(**kw), Recorder()])
    run_dir = str(tmp_path / "cb")
    tune(networks=[2], algorithms=["geodamp"], models=["mlp"], epochs=2, trials=1,
         target_accuracy=0.99, pruner="none", grid_name="cb", run_dir=run_dir,
         cluster="local", validation_seeds=0)
    study = optuna.load_study(study_name="cb/n2/geodamp/mlp",
                              storage=f"sqlite:///{run_dir}/optuna.db")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]
    updates = [r for r in seen if isinstance(r, UpdateRecord)]
    evals = [r for r in seen if isinstance(r, EvalRecord)]
    # the regular evaluations (epochs 1 and 2) and the dense ones that resolve the objective
    assert any(1.0 <= r.epoch < 1.05 for r in evals) and evals[-1].epoch == pytest.approx(2.0,
                                                                                      abs=0.05)
    assert [r.examples_seen for r in evals] == sorted({r.examples_seen for r in evals})
    assert updates[-1].epoch == pytest.approx(2.0, abs=0.05)
    assert [r.update for r in updates] == list(range(1, len(updates) + 1))
