"""Seeding a validation cell, on Optuna on SQLite: its search's best and its faster near miss,
each once per held-out seed, enqueued at once; a matched cell takes the best only."""

import optuna

from flows.tune import grid_of
from tasks.grid import Cell, GridSettings
from tasks.leases import Leases
from tasks.search import TARGET_CONSTRAINT, distributions, open_study
from tasks.validation import (
    TRAIN_SEED,
    VALIDATES,
    held_out_seeds,
    seed_validation,
    validation_settings,
)


def _seeded(tmp_path, stage, source):
    """The validation study of ``source`` (or the matched cell beside it), seeded, after a
    search of a slow best, a faster near miss (0.01 short) and a far miss (0.05 short)."""
    settings, _ = grid_of({"networks": [2], "algorithms": [source.algorithm],
                           "models": [source.model], "trials": 3, "validation_seeds": 3,
                           "grid_name": "u", "run_dir": str(tmp_path)})
    search = open_study(settings, source, n_train=4000)
    space = distributions(settings, source)
    name = next(iter(space))
    values = {"lr": (0.04, 0.1, 0.5), "factor": (2.0, 4.0, 8.0)}[name]
    for x, value, short in zip(values, (5.0, 0.5, 0.1), (0.0, 0.01, 0.05), strict=True):
        params = {k: (x if k == name else d.low) for k, d in space.items()}
        search.add_trial(optuna.trial.create_trial(params=params, distributions=space,
                                                   value=value,
                                                   constraints={TARGET_CONSTRAINT: short}))
    cell = Cell(2, "geodamp" if stage == "matched" else source.algorithm, source.model, stage)
    grid = GridSettings(**validation_settings(settings, source=source))
    study = open_study(grid, cell, n_train=4000)
    total = seed_validation(study, grid, leases=Leases(settings.storage), owner="test")
    return study, total, settings, name


def _params(trial):
    """An enqueued (WAITING) trial's configuration: Optuna keeps it until the trial is asked."""
    return trial.system_attrs["fixed_params"]


def test_a_validation_cell_is_seeded_with_its_best_and_its_faster_near_miss(tmp_path):
    study, total, settings, _ = _seeded(tmp_path, "validation", Cell(2, "sgd", "mlp"))
    seeds = held_out_seeds(settings)
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert total == 6 and len(waiting) == 6
    assert sorted((t.user_attrs[VALIDATES], _params(t)["lr"], t.user_attrs[TRAIN_SEED])
                  for t in waiting) == sorted(
        [("n2/sgd/mlp#0", 0.04, s) for s in seeds] + [("n2/sgd/mlp#1", 0.1, s) for s in seeds])


def test_a_matched_cell_retrains_the_baselines_best_only(tmp_path):
    study, total, _, name = _seeded(tmp_path, "matched", Cell(2, "geodamplr", "mlp"))
    assert total == 3
    assert {(t.user_attrs[VALIDATES], _params(t)[name]) for t in study.trials} == {
        ("n2/geodamplr/mlp#0", 2.0)}
