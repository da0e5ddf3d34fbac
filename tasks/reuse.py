"""One training, reused across network sizes: a trial whose batches never outgrew a smaller
network's cap trains the same on every network at least that large.

A run's ranks are ``ceil(batch / per_worker_batch)``, and its batch is the damper's damping,
cut only at the cap ``network × per_worker_batch``. A run whose largest damping fitted under a
cap (:func:`damptune.config.least_cap`) therefore had the same batches, learning rates and
ranks, and spent the same simulated time, on every network whose cap is at least that large.
In the default grid the fastest configurations at n8 and n16 often never need more ranks than
n4 has: their warm start asks n4's best first, and every cell trains the same held-out seeds.

A COMPLETE trial records what makes it reusable (Optuna user attribute :data:`TRAINING_ATTR`):
the digest of its configuration without the network's size
(:func:`damptune.config.training_digest`, calibration included), the ranks it needed, the
processes they ran on, its MLflow run and its outcome. Before a trial trains,
:func:`find_source` looks in the grid (any network size, its own included) for a COMPLETE
trial that:

- has the same digest (the same model, algorithm, hyperparameters, training seed, epochs,
  target and calibration);
- needed no more ranks than this trial's network has, on the same number of processes (a batch
  summed over other processes may round otherwise);
- ended before this trial's bound (:func:`tasks.search.best_value`; a trial the bound stops
  ends otherwise).

Its result is then this trial's: the same value, constraint and reports in Optuna (user
attribute :data:`REUSED_ATTR`: the source's ``<study>#<number>``), an MLflow run with its
final metrics and plots, tagged ``damptune.reused_from``, and a copy of its checkpoint (the
cell logs its best model from it). Nothing is trained. Only with a pruner that does not act
on the reports (``bound``, ``none``): another pruner could have stopped it. A source whose
checkpoint is gone (another ``checkpoint_root``) is not reused: the trial trains.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import optuna
import sqlalchemy

from damptune.config import TrainConfig, least_cap, training_digest
from tasks.grid import Cell, GridSettings
from tasks.search import pruner_acts_on_reports, storage_for

__all__ = ["TRAINING_ATTR", "REUSED_ATTR", "Source", "training_record", "find_source"]

TRAINING_ATTR = "training"  # Optuna user attribute of a COMPLETE trial: what reuses it
REUSED_ATTR = "reused_from"  # Optuna user attribute of a reused trial: its source trial


@dataclass(frozen=True)
class Source:
    """A finished trial whose training another trial reuses."""

    study_name: str
    trial: optuna.trial.FrozenTrial

    @property
    def key(self) -> str:
        return f"{self.study_name}#{self.trial.number}"

    @property
    def training(self) -> dict[str, Any]:
        return dict(self.trial.user_attrs[TRAINING_ATTR])


def training_record(config: TrainConfig, history: list[dict[str, Any]], *,
                    workers: int) -> dict[str, Any] | None:
    """What makes a finished run reusable (its outcome is added by the trial), or None when
    its own cap cut a batch (a larger network trains otherwise). ``workers``: the Dask
    workers its ranks ran on (0: one process, local mode)."""
    cap = least_cap(config, history)
    if cap is None:
        return None
    ranks = math.ceil(cap / config.per_worker_batch)
    return {"digest": training_digest(config), "ranks": ranks,
            "processes": min(ranks, workers)}


def find_source(settings: GridSettings, cell: Cell, config: TrainConfig, *,
                bound: float | None, workers: int) -> Source | None:
    """The first finished trial of the grid (by study name, then number) whose training this
    trial of ``cell`` and ``config``, on ``workers`` Dask workers, would repeat (see the
    module's docstring), or None."""
    if pruner_acts_on_reports(settings.pruner):
        return None
    store = storage_for(settings.storage)
    for study_name, trial_id in _candidates(store, settings.grid_name, training_digest(config)):
        t = store.get_trial(trial_id)
        if _repeats(t, cell.network, workers, bound):
            return Source(study_name, t)
    return None


def _candidates(store: optuna.storages.BaseStorage, grid_name: str,
                digest: str) -> list[tuple[str, int]]:
    """(study name, trial id) of the grid's COMPLETE trials recorded with ``digest``: one
    query (through Optuna's API, every study's trials with their reports would be loaded on
    every trial of the grid)."""
    assert isinstance(store, optuna.storages.RDBStorage)  # storage_for makes one
    query = sqlalchemy.text(
        "SELECT s.study_name, t.trial_id FROM trial_user_attributes AS u"
        " JOIN trials AS t ON t.trial_id = u.trial_id"
        " JOIN studies AS s ON s.study_id = t.study_id"
        " JOIN study_user_attributes AS g ON g.study_id = t.study_id"
        " WHERE u.key = :attr AND u.value_json LIKE :digest AND t.state = 'COMPLETE'"
        " AND g.key = 'grid' AND g.value_json = :grid ORDER BY s.study_name, t.number")
    with store.engine.connect() as connection:
        rows = connection.execute(query, {"attr": TRAINING_ATTR, "digest": f'%"{digest}"%',
                                          "grid": json.dumps(grid_name)}).all()
    return [(str(name), int(trial_id)) for name, trial_id in rows]


def _repeats(t: optuna.trial.FrozenTrial, network: int, workers: int,
             bound: float | None) -> bool:
    """Whether ``t``'s training is the one a trial on ``network`` ranks and ``workers`` Dask
    workers, bounded at ``bound`` simulated seconds, would train."""
    record = t.user_attrs.get(TRAINING_ATTR)
    if not isinstance(record, dict) or t.value is None:
        return False
    ranks = int(record["ranks"])
    return (ranks <= network and min(ranks, workers) == record["processes"]
            and (bound is None or t.value < bound))
