"""Held-out seeds: each cell's best configuration retrained on the grid's validation seeds.

The search's best value is the minimum over noisy trials (a winner's curse), and its training
seed also drove the search. After a cell's search, its best configuration is trained again on
``validation_seeds`` held-out training seeds: trials of a study of its own
(``<grid>/<cell>/validation``, Optuna user attribute ``train_seed``; enqueued once, so a rerun
trains only the seeds not finished yet). Every cell of the grid uses the **same** seeds, so two
algorithms of a (network, model) pair are compared seed by seed (paired): the noise the
seeds share cancels in their ratio. The answer of a cell is the mean over its seeds with a
95 % confidence interval (Student's t); :mod:`tasks.stats` compares them.

**A best that misses on the held-out seeds is replaced.** A search keeps the fastest trial that
reached the target, and a configuration that reached it just before the end of its budget on
the search's seed may miss it on most held-out seeds (the winner's curse in its plainest form).
Then its search's next fastest configuration that reached the target (else, when none is
left, the pruned one of least value so far: the bound pruned it only for being slower than
the best that just missed) is retrained on the same seeds, up to :data:`CANDIDATES`
configurations in all.

**A near miss that was faster is retrained beside the best.** Whether a trial reached the
target is judged on the search's one training seed, and a configuration that stopped short of
it by a point or two on that seed often reaches it on others. So the search's fastest COMPLETE
trial that missed the target by at most :data:`~tasks.search.NEAR_MISS` (0.015) and took less
time than its best (its near miss: :func:`tasks.search.near_miss`) is retrained on the same
held-out seeds too. The two grids of ``d79ff60`` had one in 7 and 11 of their 36 search
cells; the CNN ``adadamp`` bests that made 16 of their 17 contradictions were such cases.

The cell's answer is, of the configurations retrained that reached the target on most seeds,
the one of least mean time (else the search's best, reported as missing it). The choice
depends only on finished, deterministic trainings: a rerun makes it again, the same; a grid
seeded before near misses were retrained retrains its near miss on its next run.

**The matched comparison** (the AdaDamp paper's): ``geodamp`` with the baseline's best
``factor`` and ``delay`` (``geodamplr``'s, searched once per model), at every network size, on
the same held-out seeds: a cell of stage ``matched`` (``<grid>/n<P>/geodamp/<model>/matched``),
shown in the answer as ``geodamp-matched``. Growing the batch and decaying the learning rate by
the same factor share their trajectory up to the first growth, so their paired ratio has
little noise: it answers "does damping beat the decay it replaces?" without a search.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

import optuna

from tasks.grid import Cell, GridSettings
from tasks.leases import Leases
from tasks.objective import SCHEDULE_ATTR
from tasks.search import (
    NEAR_MISS,
    best_trial,
    near_miss,
    reached_target,
    storage_for,
    study_name,
    study_objective,
)
from tasks.stats import mostly_reached

__all__ = ["TRAIN_SEED", "VALIDATES", "SEEDED", "MATCHED", "MATCHED_SUFFIX", "CANDIDATES",
           "NEAR_MISS", "held_out_seeds", "matched_cells", "seed_validation", "extend_validation",
           "runner_up_answer", "source_cell", "validation_due", "validation_total",
           "validation_rows", "validation_settings"]

TRAIN_SEED = "train_seed"  # Optuna user attribute of a validation trial: its training seed
VALIDATES = "validates"  # ... and the search trial whose configuration it retrains
SEEDED = "validation_seeded"  # study user attribute: the seeds enqueued (once)
MATCHED = ("geodamp", "geodamplr")  # the matched cell's damper, and whose best it takes
MATCHED_SUFFIX = "-matched"  # a matched cell's rows: its damper's name and this
_CANDIDATES = "validation_candidates"  # study user attribute: the search trials retrained
STAGES = ("validation", "matched")  # the stages trained on the held-out seeds
# configurations a validation cell retrains at most: the best and 4 runners-up. With 3, the
# make run at 77e1566 left 3 of 56 rows without an answer: their fastest configurations sit at
# the edge of the target, and the next fastest are as close to it (they reached it on 0-4 of
# 8 seeds); a cell pays for more only when all before them missed
CANDIDATES = 5


def matched_cells(cells: list[Cell]) -> list[Cell]:
    """One ``matched`` cell per network size and model whose grid searches both ``geodamp``
    and the baseline (``geodamplr``)."""
    damped, baseline = MATCHED
    models = {c.model for c in cells if c.algorithm == baseline}
    return [Cell(c.network, damped, c.model, stage="matched") for c in cells
            if c.algorithm == damped and c.stage == "search" and c.model in models]


def source_cell(cell: Cell, cells: list[Cell]) -> Cell:
    """The search cell whose best configuration ``cell`` retrains: its own search, or for a
    matched cell the baseline's search at its network size (the smallest, where a baseline
    that never grows was searched once)."""
    if cell.stage != "matched":
        return cell.searched
    baselines = sorted((c for c in cells if c.algorithm == MATCHED[1]
                        and c.model == cell.model and c.stage == "search"),
                       key=lambda c: (c.network != cell.network, c.network))
    return baselines[0]


def held_out_seeds(settings: GridSettings) -> list[int]:
    """The grid's validation training seeds: a function of its ``seed`` and their index only
    (the same for every cell), never the search's own training seed."""
    seeds: list[int] = []
    k = 0
    while len(seeds) < settings.validation_seeds:
        digest = hashlib.sha256(f"damptune:validation:{settings.seed}:{k}".encode()).digest()
        seed = int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
        if seed != settings.seed and seed not in seeds:
            seeds.append(seed)
        k += 1
    return seeds


# a held-out training's epoch budget, as a multiple of its search's. The budget caps what a
# search trial may cost; a held-out training measures a configuration's time to the target.
# At the search's own budget, the CNN's fastest configurations ran out of epochs just short
# of the target on about half the held-out seeds (0.3-1.9 points), so whether one reached it
# on most seeds, and answered, or gave way to a runner-up twice as slow, was a coin's throw
# (the two 8ddcd45 grids: 12 of their 14 contradictions)
HELD_OUT_EPOCHS = 1.5


def validation_settings(grid: GridSettings, *, source: Cell) -> dict[str, Any]:
    """A validation cell's settings (as a dict, like a search cell's ``grid.to_dict()``):
    one trial per held-out seed, trained to the target or :data:`HELD_OUT_EPOCHS` times the
    search's epoch budget (with the budget objective, the budget itself: it is what is timed;
    no bound: every seed's time is measured), no warm start; the
    search's trial total is kept
    (``extra["search_trials"]``): only a finished search is validated; and the search cell
    whose best it retrains (``extra["source"]``, :func:`source_cell`)."""
    settings = grid.to_dict()
    extra = {**settings.get("extra", {}), "search_trials": grid.trials_for(source.model),
             "source": dataclasses.asdict(source)}
    epochs, factor = settings["epochs"], HELD_OUT_EPOCHS if grid.objective == "target" else 1
    longer = ({model: e * factor for model, e in epochs.items()}
              if isinstance(epochs, dict) else epochs * factor)
    return {**settings, "trials": grid.validation_seeds, "pruner": "none", "epochs": longer,
            "warm_start": False, "extra": extra}


def _search_finished(searched: optuna.Study, grid: GridSettings) -> bool:
    """Whether the search has all its trials finished (none left RUNNING by an interrupted
    or another live run): its best is then final for this total."""
    trials = searched.get_trials(deepcopy=False)
    if any(t.state == optuna.trial.TrialState.RUNNING for t in trials):
        return False
    total = int(grid.extra.get("search_trials", grid.trials))
    return sum(t.state.is_finished() for t in trials) >= total


def seed_validation(study: optuna.Study, grid: GridSettings, *, leases: Leases,
                    owner: str) -> int:
    """Enqueue the best configuration of the search cell ``grid.extra["source"]`` once per
    held-out seed (once per study, by one run: the others wait for it). Returns the number of
    validation trials the study has or will have: 0 while the search is not finished (an
    interrupted grid: its rerun validates the final best) or has no COMPLETE trial (nothing
    to validate)."""
    key, deadline = f"{study.study_name}#seeding", time.monotonic() + 2 * leases.ttl
    while not leases.acquire(key, owner):  # another live run is seeding: wait for it
        if validation_due(study) or time.monotonic() > deadline:
            return validation_total(study)
        time.sleep(1.0)
    try:
        return _seed(study, grid)
    finally:
        leases.release(key, owner)


def _seed(study: optuna.Study, grid: GridSettings) -> int:
    if study.user_attrs.get(SEEDED):
        return validation_total(study)
    source, searched = _searched(grid)
    trials = searched.get_trials(deepcopy=False)
    best = best_trial(trials)
    if best is None or not _search_finished(searched, grid):
        return 0
    seeds, retrain = held_out_seeds(grid), [best]
    if study.user_attrs.get("stage") == "validation":  # a matched cell takes the best only
        retrain += [t for t in [_near_miss(trials, [], source)] if t is not None]
    for trial in retrain:
        _enqueue(study, trial, seeds, f"{source.key}#{trial.number}")
    study.set_user_attr(_CANDIDATES, [f"{source.key}#{t.number}" for t in retrain])
    study.set_user_attr(SEEDED, seeds)
    return validation_total(study)


def _searched(grid: GridSettings) -> tuple[Cell, optuna.Study]:
    source = Cell(**grid.extra["source"])
    return source, optuna.load_study(study_name=study_name(grid, source),
                                     storage=storage_for(grid.storage))


def _enqueue(study: optuna.Study, trial: optuna.trial.FrozenTrial, seeds: list[int],
             validates: str) -> None:
    """``trial``'s configuration once per seed (only the seeds not there yet: a rerun after a
    kill mid-way)."""
    there = {(t.user_attrs.get(VALIDATES), t.user_attrs.get(TRAIN_SEED))
             for t in study.get_trials(deepcopy=False)}
    for seed in (s for s in seeds if (validates, s) not in there):
        study.enqueue_trial(dict(trial.params), skip_if_exists=False, user_attrs={
            TRAIN_SEED: seed, VALIDATES: validates})


def _candidates(study: optuna.Study) -> list[str]:
    """The search trials the study retrains, in order (``<cell>#<number>``); a study seeded
    before runners-up were retrained has its one, named by its trials."""
    listed = study.user_attrs.get(_CANDIDATES)
    if listed:
        return list(listed)
    return list(dict.fromkeys(str(t.user_attrs.get(VALIDATES, ""))
                              for t in study.get_trials(deepcopy=False)))[:1]


def validation_total(study: optuna.Study) -> int:
    """The trials the validation study has or will have: its seeds for each configuration it
    retrains (0 before it is seeded)."""
    return len(study.user_attrs.get(SEEDED) or []) * max(1, len(_candidates(study)))


def extend_validation(study: optuna.Study, grid: GridSettings, *, leases: Leases,
                      owner: str) -> int:
    """Enqueue the next configuration the study should retrain (:func:`_retrain_next`), up to
    :data:`CANDIDATES` in all. Returns the trials the study has or will have
    (:func:`validation_total`): unchanged when none is due."""
    key = f"{study.study_name}#seeding"
    while not leases.acquire(key, owner):  # another live run extends it: wait for it
        time.sleep(0.2)
    try:
        tried, seeds = _candidates(study), list(study.user_attrs.get(SEEDED) or [])
        if seeds and len(tried) < CANDIDATES:
            _retrain_next(study, grid, tried, seeds)
        return validation_total(study)
    finally:
        leases.release(key, owner)


def _retrain_next(study: optuna.Study, grid: GridSettings, tried: list[str],
                  seeds: list[int]) -> None:
    """Enqueue on ``seeds``: the search's near miss (:func:`_near_miss`) when no trial retrains
    it yet (a grid seeded before near misses were retrained); else, when every configuration
    retrained so far has all its seeds finished and missed the target on most of them, its
    runner-up (:func:`_runner_up`: one not retrained yet)."""
    source, searched = _searched(grid)
    trials = searched.get_trials(deepcopy=False)
    nxt = _near_miss(trials, tried, source)
    if nxt is None and _all_missed(study.get_trials(deepcopy=False), tried, len(seeds)):
        nxt = _runner_up(trials, tried, source)
    if nxt is not None:
        name = f"{source.key}#{nxt.number}"
        _enqueue(study, nxt, seeds, name)
        study.set_user_attr(_CANDIDATES, [*tried, name])


def _all_missed(trials: list[optuna.trial.FrozenTrial], tried: list[str], n_seeds: int) -> bool:
    """Whether each configuration in ``tried`` has its ``n_seeds`` trials finished and missed
    the target on most of them."""
    groups = [[t for t in trials if t.user_attrs.get(VALIDATES) == name] for name in tried]
    return bool(groups) and all(len(g) >= n_seeds and all(t.state.is_finished() for t in g)
                                and not _mostly_reached(g) for g in groups)


def _near_miss(trials: list[optuna.trial.FrozenTrial], tried: list[str],
               source: Cell) -> optuna.trial.FrozenTrial | None:
    """The search's near miss (:func:`tasks.search.near_miss`, by :data:`NEAR_MISS`); None
    when there is none, or a trial in ``tried`` has its configuration already."""
    fastest = near_miss(trials, NEAR_MISS)
    if fastest is None or fastest.params in _retrained(trials, tried, source):
        return None
    return fastest


def _retrained(trials: list[optuna.trial.FrozenTrial], tried: list[str],
               source: Cell) -> list[dict[str, Any]]:
    """The configurations of the search trials named in ``tried`` (``<cell>#<number>``)."""
    by_name = {f"{source.key}#{t.number}": t for t in trials}
    return [by_name[n].params for n in tried if n in by_name]


def _mostly_reached(trials: list[optuna.trial.FrozenTrial]) -> bool:
    """Whether these finished validation trials reached the target on most of their seeds
    (:func:`tasks.stats.mostly_reached`: a trial that did not complete missed)."""
    return mostly_reached([t.state == optuna.trial.TrialState.COMPLETE and reached_target(t)
                           for t in trials], len(trials))


def _runner_up(trials: list[optuna.trial.FrozenTrial], tried: list[str],
               source: Cell) -> optuna.trial.FrozenTrial | None:
    """The search's next configuration to retrain, one that no trial in ``tried`` has: its
    fastest COMPLETE trial that reached the target; when none is left, its PRUNED trial of
    least value so far. A trial the bound pruned was only slower than a best that has now
    missed on the held-out seeds; in a bound-pruned search that best is often the only
    trial that finished, so its runners-up are pruned ones, whose time the held-out seeds
    measure in full (no bound)."""
    seen = _retrained(trials, tried, source)
    fresh = [t for t in trials if t.value is not None and t.params not in seen]
    reached = [t for t in fresh if t.state == optuna.trial.TrialState.COMPLETE
               and reached_target(t)]
    pruned = [t for t in fresh if t.state == optuna.trial.TrialState.PRUNED]
    return min(reached or pruned, key=lambda t: (t.value, t.number), default=None)


def validation_due(study: optuna.Study) -> bool:
    """Whether the validation study has seeds to train (its search had a best to retrain)."""
    return bool(study.user_attrs.get(SEEDED))


def validation_rows(storage: str, *, grid_name: str, first_seeds: int | None = None
                    ) -> list[dict[str, Any]]:
    """One row per validation study of the grid: its cell, and each held-out seed's value
    and whether it reached the target (COMPLETE trials only); ``retrained``: how many
    configurations the cell retrained.

    ``first_seeds``: read only the first K held-out seeds of each cell, as a grid with
    ``validation_seeds=K`` trained them (the seeds are a prefix: :func:`held_out_seeds`), and
    pick the configuration that answers by those seeds (``bench/answer_stability.py
    --held-out K``). A runner-up such a grid would have retrained next, that this grid did
    not, is not there: the rule's fallback (the search's best) answers."""
    rows: list[dict[str, Any]] = []
    store, searched = storage_for(storage), _SearchTrials(storage, grid_name)
    for s in optuna.get_all_study_summaries(store, include_best_trial=False):
        attrs = s.user_attrs
        if attrs.get("grid") != grid_name or attrs.get("stage") not in STAGES:
            continue
        study = optuna.load_study(study_name=s.study_name, storage=store)
        seeds = list(attrs.get(SEEDED) or [])[:first_seeds]
        groups = _groups(study, set(seeds) if first_seeds is not None else None)
        done, replaced = _answer_trials(groups)
        validates = str(done[0].user_attrs.get(VALIDATES, "")) if done else ""
        rows.append({
            "network": int(attrs["network"]),
            "algorithm": str(attrs["algorithm"]) + (MATCHED_SUFFIX if attrs["stage"] == "matched"
                                                    else ""),
            "model": str(attrs["model"]), "study": s.study_name,
            "objective": study_objective(attrs),
            "values": {int(t.user_attrs[TRAIN_SEED]): float(t.value or 0.0) for t in done},
            "reached": {int(t.user_attrs[TRAIN_SEED]): reached_target(t) for t in done},
            "params": dict(done[0].params) if done else {},
            "validates": validates,
            "n_seeds": len(seeds), "replaced": replaced, "retrained": len(groups),
            "unchanged_seeds": _unchanged_seeds(done),
            "search_shortfall": searched.shortfall(validates),
        })
    rows.sort(key=lambda r: (r["network"], r["model"], r["algorithm"]))
    return rows


def _unchanged_seeds(done: list[optuna.trial.FrozenTrial]) -> int | None:
    """On how many of its held-out seeds the answering configuration stopped before its
    schedule changed the batch size or learning rate (it trained as plain SGD there); None
    when a trial does not say (a grid from before it was recorded)."""
    known = [t.user_attrs[SCHEDULE_ATTR] for t in done if SCHEDULE_ATTR in t.user_attrs]
    return sum(epoch is None for epoch in known) if done and len(known) == len(done) else None


class _SearchTrials:
    """The grid's search trials, loaded once per search study, by the name a validation trial
    records of the one it retrains (``<cell>#<number>``)."""

    def __init__(self, storage: str, grid_name: str) -> None:
        self.storage, self.grid_name = storage, grid_name
        self.trials: dict[str, dict[int, optuna.trial.FrozenTrial]] = {}

    def shortfall(self, validates: str) -> float | None:
        """By how much that search trial missed the search's target on its one seed, within
        the search's epochs: 0 when it reached it (a near miss retrained beside the best is
        above 0); None when it did not complete (a pruned runner-up) or is not there."""
        cell, _, number = validates.rpartition("#")
        if not cell or not number.isdigit():
            return None
        trial = self._of(f"{self.grid_name}/{cell}").get(int(number))
        if trial is None or trial.state != optuna.trial.TrialState.COMPLETE:
            return None
        return max([0.0, *trial.constraints.values()])

    def _of(self, name: str) -> dict[int, optuna.trial.FrozenTrial]:
        if name not in self.trials:
            try:
                study = optuna.load_study(study_name=name, storage=storage_for(self.storage))
                self.trials[name] = {t.number: t for t in study.get_trials(deepcopy=False)}
            except KeyError:  # the search study is not in this storage
                self.trials[name] = {}
        return self.trials[name]


def _answer_trials(groups: list[list[optuna.trial.FrozenTrial]]
                   ) -> tuple[list[optuna.trial.FrozenTrial], list[dict[str, Any]]]:
    """The COMPLETE trials of the configuration that answers for the cell
    (:func:`_answer_index`); and what it replaced: the ones retrained before it, which missed
    the target on most seeds or took longer (``validates``, seeds, seeds reached, mean)."""
    answer = _answer_index(groups)
    done = [t for t in groups[answer] if t.state == optuna.trial.TrialState.COMPLETE
            and t.value is not None]
    replaced = [{"validates": str(g[0].user_attrs.get(VALIDATES, "")), "n_seeds": len(g),
                 "reached_seeds": sum(reached_target(t) for t in g
                                      if t.state == optuna.trial.TrialState.COMPLETE),
                 "mean": _mean(g)}
                for g in groups[:answer] if g]
    return done, replaced


def _groups(study: optuna.Study, seeds: set[int] | None = None
            ) -> list[list[optuna.trial.FrozenTrial]]:
    """The study's trials per configuration retrained, in the order retrained (only those of
    ``seeds``, if given)."""
    trials = [t for t in study.get_trials(deepcopy=False)
              if seeds is None or int(t.user_attrs.get(TRAIN_SEED, -1)) in seeds]
    return [[t for t in trials if str(t.user_attrs.get(VALIDATES, "")) == name]
            for name in _candidates(study)] or [trials]


def _answer_index(groups: list[list[optuna.trial.FrozenTrial]]) -> int:
    """Of the configurations retrained that reached the target on most seeds, the one of least
    mean time over its seeds (the first retrained of equals); else the search's best (the
    first)."""
    reached = [i for i, g in enumerate(groups) if _mostly_reached(g)]
    means = {i: _mean(groups[i]) for i in reached}
    return min(reached, key=lambda i: (float("inf") if means[i] is None else means[i], i),
               default=0)


def _mean(group: list[optuna.trial.FrozenTrial]) -> float | None:
    """The mean value of the group's COMPLETE trials; None when none completed."""
    values = [float(t.value) for t in group
              if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    return sum(values) / len(values) if values else None


def runner_up_answer(study: optuna.Study) -> int | None:
    """When another configuration than the search's best answers for the validation cell (a
    runner-up: the best missed; or a near miss that was faster), the number of its validation
    trial that reached the target fastest: a model of that configuration trained to the
    target (the search's own trial of it may have been pruned half-way, or missed the
    target). None when the search's best answers, or nothing was retrained yet."""
    groups = _groups(study)
    answer = _answer_index(groups)
    if answer == 0:  # the search's best answers (or nothing was retrained)
        return None
    reached = [t for t in groups[answer] if t.state == optuna.trial.TrialState.COMPLETE
               and t.value is not None and reached_target(t)]
    return min(reached, key=lambda t: (t.value, t.number)).number if reached else None
