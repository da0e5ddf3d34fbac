"""Real grids for the report's tests, without the flow: Optuna studies opened the way
``tasks/search.py::open_study`` opens them (same user attributes), and each trial's checkpoint
from a real short local-mode training run of the trial's own configuration
(``tasks.trial.trial_config``), saved where ``tasks.trial.checkpoint_path`` puts it. The trial's
value is ``tasks.objective.objective`` of its history, as a real trial's is."""

from __future__ import annotations

import dataclasses
import os

import optuna

from damptune import TrainData, train
from damptune.checkpoint import load_checkpoint
from models import load_dataset
from tasks.grid import Cell, GridSettings, checkpoint_path
from tasks.objective import objective
from tasks.report import write_meta
from tasks.search import TARGET_CONSTRAINT, distributions, open_study
from tasks.trial import trial_config

# a fixed compute calibration (seconds), as a study keeps its first measurement
CALIBRATION = dict(compute_per_example=2e-5, compute_fixed=1e-4, compute_forward_per_example=7e-6,
                   compute_forward_fixed=5e-5, compute_norm=2e-5)
# hyperparameters of each algorithm's trials 0, 1, … (within the search space at 3 epochs)
TRIALS = {
    "geodamplr": [{"factor": 2.0, "delay": 1}],
    "geodamp": [{"factor": 1.5, "delay": 3}, {"factor": 4.0, "delay": 1}],
    "padadamp": [{"rate": 0.05}],
    "cntsdamplr": [{"c": 5.0}],  # the step size decays at once: misses the target
    "radadamp": [{"rho": 0.9}],
}


def settings_for(run_dir: str, *, grid_name: str = "rep", target: float = 0.45,
                 epochs: float = 3.0, **extra: object) -> GridSettings:
    """The grid's settings: local mode, fewer evaluations than the default (faster here)."""
    return GridSettings(grid_name=grid_name, trials=2, epochs=epochs, target_accuracy=target,
                        mode="local", run_dir=run_dir, storage=f"sqlite:///{run_dir}/optuna.db",
                        eval_resolution=0.1, eval_dense_margin=0.0, **extra)  # type: ignore[arg-type]


def build_grid(settings: GridSettings, *, networks: tuple[int, ...] = (2, 4),
               algorithms: tuple[str, ...] = ("geodamplr", "geodamp", "padadamp"),
               models: tuple[str, ...] = ("mlp",), trials: dict | None = None) -> GridSettings:
    """Train every trial of every cell, save its checkpoint, record it in its study."""
    os.makedirs(settings.run_dir, exist_ok=True)
    ds = load_dataset(settings.dataset, seed=settings.seed)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    for network in networks:
        for algorithm in algorithms:
            for model in models:
                cell = Cell(network, algorithm, model)
                study = open_study(settings, cell, n_train=len(ds.y_train))
                space = distributions(settings, cell)
                for number, params in enumerate((trials or TRIALS)[algorithm]):
                    config = dataclasses.replace(trial_config(settings, cell, params, ds),
                                                 checkpoint_seconds=None, **CALIBRATION)
                    state = train(config, data,
                                  checkpoint_path=checkpoint_path(settings, cell, number))
                    # the target the engine stopped at and a real trial is judged at
                    # (tasks.trial._judge): the model's plus search_margin in a search cell
                    target = settings.target_of(cell)
                    value, reached, best = objective(state.history, target=target)
                    study.add_trial(optuna.trial.create_trial(  # as the cell's driver records it
                        params=params, distributions={k: space[k] for k in params},
                        value=value,
                        constraints={TARGET_CONSTRAINT: 0.0 if reached else target - best}))
    write_meta(settings.run_dir, {"grid_name": settings.grid_name,
                                  "storage": settings.storage,
                                  "checkpoint_root": settings.checkpoint_root})
    return settings


def checkpoint_of(settings: GridSettings, cell: Cell, number: int) -> dict:
    return load_checkpoint(checkpoint_path(settings, cell, number))
