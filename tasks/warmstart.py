"""Warm start across cells: a cell's study begins with the best configurations of the
finished cells next to it.

The neighbours of a cell (:func:`neighbours`) are the same algorithm and model at the nearest
smaller network size of the grid, and the same algorithm at the same network size on the
models listed before it. The flow starts a cell only once its neighbours have finished
(:func:`tasks.grid.cells_of` lists them first), so what a cell is seeded with depends on the
grid alone, never on timing: a rerun of a warm-started grid asks the same trials.

Before its first trial, the cell enqueues (``study.enqueue_trial``) each neighbour's best
COMPLETE configuration, and its near miss when it has one (:func:`tasks.search.near_miss`: a
faster trial that stopped just short of the target on the search's seed, which a best that
reached it only slowly would otherwise keep from the larger sizes), clipped to its own
search space, with the user attribute
``seeded_from`` (``<neighbour cell>#<trial number>``); its MLflow run is tagged
``damptune.seeded_from``. The study's user attribute ``warm_start`` records what was enqueued,
so a rerun never enqueues twice.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

from tasks.grid import Cell
from tasks.search import best_trial, near_miss

__all__ = ["neighbours", "seed_study", "SEEDED_FROM", "seeds_of"]

SEEDED_FROM = "seeded_from"  # Optuna user attribute of an enqueued trial
_DONE = "warm_start"  # study user attribute: the seeds enqueued


def neighbours(cell: Cell, cells: list[Cell]) -> list[Cell]:
    """The cells whose best configurations seed ``cell`` (all of them in ``cells``)."""
    models = list(dict.fromkeys(c.model for c in cells))
    smaller = sorted({c.network for c in cells if c.network < cell.network})
    out = []
    if smaller:
        out.append(Cell(smaller[-1], cell.algorithm, cell.model))
    out += [Cell(cell.network, cell.algorithm, m) for m in models[: models.index(cell.model)]]
    return [c for c in out if c in cells]


def _clip(value: Any, dist: BaseDistribution) -> Any:
    if isinstance(dist, IntDistribution):
        return int(min(max(int(round(value)), dist.low), dist.high))
    if isinstance(dist, FloatDistribution):
        return float(min(max(float(value), dist.low), dist.high))
    return value


def seeds_of(sources: list[tuple[Cell, optuna.Study]],
             space: dict[str, BaseDistribution]) -> list[tuple[str, dict[str, Any]]]:
    """(seeded_from, params) for each source study's best COMPLETE trial and its near miss
    (:func:`tasks.search.near_miss`), clipped to ``space``; duplicates (after clipping)
    once."""
    seeds: list[tuple[str, dict[str, Any]]] = []
    for cell, study in sources:
        trials = study.get_trials(deepcopy=False)
        for trial in (best_trial(trials), near_miss(trials)):
            if trial is None or not set(space) <= set(trial.params):
                continue
            params = {k: _clip(trial.params[k], d) for k, d in space.items()}
            if all(params != p for _, p in seeds):
                seeds.append((f"{cell.key}#{trial.number}", params))
    return seeds


def seed_study(study: optuna.Study, seeds: list[tuple[str, dict[str, Any]]]) -> int:
    """Enqueue ``seeds`` before the study's first trial, once: a rerun killed halfway
    enqueues the rest; a study that already has trials of its own gets none. Returns how many
    were enqueued now."""
    if _DONE in study.user_attrs:
        return 0
    trials = study.get_trials(deepcopy=False)
    if any(SEEDED_FROM not in t.user_attrs for t in trials):
        study.set_user_attr(_DONE, [])  # it started unseeded: keep it so
        return 0
    have = {t.user_attrs[SEEDED_FROM] for t in trials}
    todo = [(origin, params) for origin, params in seeds if origin not in have]
    for origin, params in todo:
        study.enqueue_trial(params, user_attrs={SEEDED_FROM: origin}, skip_if_exists=False)
    study.set_user_attr(_DONE, [origin for origin, _ in seeds])
    return len(todo)
