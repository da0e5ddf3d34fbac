"""Which finished training a trial reuses (tasks.reuse.find_source), in Optuna on SQLite: one
of the same grid and digest, that needed no more ranks than the trial's network has, on the
same processes, and ended before the trial's bound."""

import optuna
from optuna.distributions import FloatDistribution

from damptune import TrainConfig
from damptune.config import training_digest
from tasks.grid import Cell, GridSettings
from tasks.reuse import TRAINING_ATTR, find_source
from tasks.search import open_study

CONFIG = TrainConfig(module="models.mlp:MLP", damper="geodamp", compute_per_example=1e-5)


def _finished(settings, cell, value, **record):
    study = open_study(settings, cell, n_train=100)
    training = {"digest": training_digest(CONFIG), "ranks": 2, "processes": 1, "run_id": "r",
                "reached": True, "best_accuracy": 0.9, "examples_seen": 10, **record}
    study.add_trial(optuna.trial.create_trial(
        params={"factor": 2.0}, distributions={"factor": FloatDistribution(1.5, 10.0)},
        value=value, user_attrs={TRAINING_ATTR: training}))
    return study


def _found(settings, network=4, *, workers=1, bound=None, config=CONFIG):
    source = find_source(settings, Cell(network, "geodamp", "mlp"), config, bound=bound,
                         workers=workers)
    return None if source is None else source.key


def test_a_trial_reuses_a_training_that_fits_its_network_and_processes(tmp_path):
    settings = GridSettings(grid_name="g", storage=f"sqlite:///{tmp_path}/o.db")
    _finished(settings, Cell(2, "geodamp", "mlp"), 1.0, processes=2)  # 2 ranks, 2 workers
    assert _found(settings, workers=2) == "g/n2/geodamp/mlp#0"
    assert _found(settings, 2, workers=2) == "g/n2/geodamp/mlp#0"  # its own size (matched)
    assert _found(settings, workers=4) == "g/n2/geodamp/mlp#0"  # 2 ranks: 2 of the 4 train
    assert _found(settings, workers=1) is None  # 2 ranks' shares summed in one process
    assert _found(settings, workers=2, bound=1.5) == "g/n2/geodamp/mlp#0"


def test_nothing_is_reused_that_would_have_trained_otherwise(tmp_path):
    settings = GridSettings(grid_name="g", storage=f"sqlite:///{tmp_path}/o.db")
    _finished(settings, Cell(8, "geodamp", "mlp"), 1.0, ranks=8, processes=2)
    assert _found(settings, 4, workers=2) is None  # needs 8 ranks: more than n4 has
    assert _found(settings, 16, workers=4) is None  # 8 ranks on 4 processes, not 2
    assert _found(settings, 16, workers=2) == "g/n8/geodamp/mlp#0"
    assert _found(settings, 16, workers=2, bound=1.0) is None  # the bound would stop it
    other = TrainConfig(module="models.mlp:MLP", damper="geodamp", compute_per_example=2e-5)
    assert _found(settings, 16, workers=2, config=other) is None  # another calibration
    elsewhere = GridSettings(grid_name="h", storage=settings.storage)
    assert _found(elsewhere, 16, workers=2) is None  # another grid's


def test_a_pruner_that_acts_on_the_reports_turns_reuse_off(tmp_path):
    settings = GridSettings(grid_name="g", storage=f"sqlite:///{tmp_path}/o.db")
    _finished(settings, Cell(2, "geodamp", "mlp"), 1.0)
    assert _found(settings) is not None
    settings.pruner = "hyperband"
    assert _found(settings) is None
