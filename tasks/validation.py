"""Held-out seeds: each cell's configuration chosen on selection seeds, then measured on
estimation seeds that no choice saw.

The search's best value is the minimum over noisy trials on one training seed (a winner's
curse). So the answer of a cell takes three stages, each a study of its own:

1. **search** (``<grid>/<cell>``): the Optuna search, on the grid's seed and data. The baseline
   (the algorithms whose batch never grows: ``geodamplr``, ``cntsdamplr``, ``sgd``) is searched
   :attr:`~tasks.grid.GridSettings.baseline_searches` times (R, default 4), independently:
   replicas ``<cell>/r1`` … with their own sampler seeds and no warm start. Damping must beat a
   well-tuned baseline: the conservative comparison.
2. **selection** (``<grid>/<cell>/selection``): the search's ``selection_candidates`` (k,
   default 3) fastest configurations (for the baseline, every replica's best first), each
   retrained on ``selection_seeds`` (S, default 2) selection seeds. The chosen configuration
   reached the target on the most selection seeds, with the least mean time of those. Its
   search's best is first among them, then the search's near miss (a faster trial that stopped
   within :data:`~tasks.search.NEAR_MISS` of the target on the search's seed), then its
   runners-up (trials that reached the target, else pruned ones by least value so far).
3. **estimation** (``<grid>/<cell>/validation``): the chosen configuration trained on
   ``validation_seeds`` (K, default 8) estimation seeds. These seeds are the same for every
   cell of the grid, so two algorithms of a (network, model) pair are compared seed by seed
   (paired), and no selection saw them: the reported mean, its 95 % interval (Student's t) and
   every speedup come from them only (:mod:`tasks.stats`).

Held-out trainings vary the data with the training seed (each held-out seed is also the
generated dataset's seed; Bouthillier et al. 2021: data sampling is a source of variance the
answer must hold). Optuna user attributes of a held-out trial: ``train_seed`` and
``validates`` (the search trial whose configuration it retrains, ``<cell>#<number>``). A
stage is seeded once (study attribute ``validation_seeded``): a rerun trains only what is not
finished.

**The matched comparison** (the AdaDamp paper's): ``geodamp`` with the baseline's chosen
``factor`` and ``delay`` (``geodamplr``'s), at every network size, on the estimation seeds: a
cell of stage ``matched`` (``<grid>/n<P>/geodamp/<model>/matched``), shown in the answer as
``geodamp-matched``. Growing the batch and decaying the learning rate by the same factor share
their trajectory up to the first growth, so their paired ratio has little noise: it answers
"does damping beat the decay it replaces?" without a search.
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

__all__ = ["TRAIN_SEED", "VALIDATES", "SEEDED", "MATCHED", "MATCHED_SUFFIX", "SELECTION",
           "STAGES", "HELD_OUT_STAGES", "NEAR_MISS", "held_out_seeds",
           "matched_cells", "selection_cells", "sources_of", "seed_validation",
           "selection_candidates", "chosen_configuration", "runner_up_answer", "source_cell",
           "validation_due", "validation_total", "validation_rows", "validation_settings",
           "expected_trials"]

TRAIN_SEED = "train_seed"  # Optuna user attribute of a held-out trial: its training seed
VALIDATES = "validates"  # ... and the search trial whose configuration it retrains
SEEDED = "validation_seeded"  # study user attribute: the seeds enqueued (once)
MATCHED = ("geodamp", "geodamplr")  # the matched cell's damper, and whose choice it takes
MATCHED_SUFFIX = "-matched"  # a matched cell's rows: its damper's name and this
_CANDIDATES = "validation_candidates"  # study user attribute: the search trials retrained
SELECTION = "selection"  # the stage that chooses a cell's configuration on selection seeds
STAGES = ("validation", "matched")  # the stages trained on the estimation seeds: the answer
HELD_OUT_STAGES = (SELECTION, *STAGES)  # every stage trained on held-out seeds


def matched_cells(cells: list[Cell]) -> list[Cell]:
    """One ``matched`` cell per network size and model whose grid searches both ``geodamp``
    and the baseline (``geodamplr``)."""
    damped, baseline = MATCHED
    models = {c.model for c in cells if c.algorithm == baseline}
    return [Cell(c.network, damped, c.model, stage="matched") for c in cells
            if c.algorithm == damped and c.stage == "search" and not c.replica
            and c.model in models]


def selection_cells(cells: list[Cell]) -> list[Cell]:
    """One ``selection`` cell per search cell (the baseline's replicas share one)."""
    return [dataclasses.replace(c, stage=SELECTION) for c in cells
            if c.stage == "search" and not c.replica]


def sources_of(cell: Cell, cells: list[Cell]) -> list[Cell]:
    """The cells a held-out cell takes its configurations from, and waits for: a selection
    cell, its search and the search's replicas; an estimation (validation) cell, its selection
    cell; a matched cell, the baseline's selection cell at its network size (else the
    smallest, where a baseline that never grows was searched)."""
    if cell.stage == SELECTION:
        return [c for c in cells if c.stage == "search" and c.network == cell.network
                and (c.algorithm, c.model) == (cell.algorithm, cell.model)]
    if cell.stage != "matched":
        return [Cell(cell.network, cell.algorithm, cell.model, stage=SELECTION)]
    baselines = sorted((c for c in cells if c.algorithm == MATCHED[1] and c.replica == 0
                        and c.model == cell.model and c.stage == "search"),
                       key=lambda c: (c.network != cell.network, c.network))
    return [dataclasses.replace(baselines[0], stage=SELECTION)]


def source_cell(cell: Cell, cells: list[Cell]) -> Cell:
    """The search cell (replica 0) whose configurations ``cell`` retrains, directly or
    through a selection: its MLflow model follows the answer."""
    return sources_of(cell, cells)[0].searched if cell.stage == "matched" else cell.searched


def held_out_seeds(settings: GridSettings, stage: str = "validation") -> list[int]:
    """The grid's held-out training seeds of a stage: the estimation seeds
    (``validation_seeds`` of them) or the selection seeds (``selection_seeds``); a function of
    the grid's ``seed``, the stage and their index only (the same for every cell), never the
    search's own training seed, and no selection seed is an estimation seed."""
    count = settings.selection_seeds if stage == SELECTION else settings.validation_seeds
    taken = {settings.seed} | ({*held_out_seeds(settings)} if stage == SELECTION else set())
    space = "validation" if stage != SELECTION else SELECTION
    seeds: list[int] = []
    k = 0
    while len(seeds) < count:
        digest = hashlib.sha256(f"damptune:{space}:{settings.seed}:{k}".encode()).digest()
        seed = int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
        if seed not in taken and seed not in seeds:
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


def validation_settings(grid: GridSettings, *, sources: list[Cell],
                        stage: str = "validation") -> dict[str, Any]:
    """A held-out cell's settings (as a dict, like a search cell's ``grid.to_dict()``): one
    trial per held-out seed and configuration, trained to the target or
    :data:`HELD_OUT_EPOCHS` times the search's epoch budget (with the budget objective, the
    budget itself: it is what is timed; no bound: every seed's time is measured), no warm
    start; the search's trial total (``extra["search_trials"]``: only a finished search is
    retrained); the cells it takes configurations from (``extra["sources"]``,
    :func:`sources_of`) and the search cell whose model follows it (``extra["source"]``)."""
    settings = grid.to_dict()
    source = sources[0].searched
    extra = {**settings.get("extra", {}), "search_trials": grid.trials_for(source.model),
             "source": dataclasses.asdict(source),
             "sources": [dataclasses.asdict(c) for c in sources]}
    epochs, factor = settings["epochs"], HELD_OUT_EPOCHS if grid.objective == "target" else 1
    longer = ({model: e * factor for model, e in epochs.items()}
              if isinstance(epochs, dict) else epochs * factor)
    seeds = grid.selection_seeds if stage == SELECTION else grid.validation_seeds
    return {**settings, "trials": seeds, "pruner": "none", "epochs": longer,
            "warm_start": False, "extra": extra}


def _finished(study: optuna.Study, total: int) -> bool:
    """Whether the study holds ``total`` finished trials, none left RUNNING by an interrupted
    or another live run: what it says is then final."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state == optuna.trial.TrialState.RUNNING for t in trials):
        return False
    return sum(t.state.is_finished() for t in trials) >= total


def seed_validation(study: optuna.Study, grid: GridSettings, *, leases: Leases,
                    owner: str) -> int:
    """Enqueue a held-out study's trials once (by one run: the others wait for it): a
    selection study's candidates on the selection seeds; an estimation or matched study's
    chosen configuration on the estimation seeds. Returns the number of trials the study has
    or will have: 0 while what it takes from is not finished (an interrupted grid: its rerun
    seeds it) or has nothing to retrain."""
    key, deadline = f"{study.study_name}#seeding", time.monotonic() + 2 * leases.ttl
    while not leases.acquire(key, owner):  # another live run is seeding: wait for it
        if validation_due(study) or time.monotonic() > deadline:
            return validation_total(study)
        time.sleep(1.0)
    try:
        if study.user_attrs.get(SEEDED):
            return validation_total(study)
        if study.user_attrs.get("stage") == SELECTION:
            return _seed_selection(study, grid)
        return _seed_estimation(study, grid)
    finally:
        leases.release(key, owner)


def _load(grid: GridSettings, cell: Cell) -> optuna.Study:
    return optuna.load_study(study_name=study_name(grid, cell),
                             storage=storage_for(grid.storage))


def _seed_selection(study: optuna.Study, grid: GridSettings) -> int:
    total = int(grid.extra.get("search_trials", grid.trials))
    sources = [(c, _load(grid, c)) for c in (Cell(**d) for d in grid.extra["sources"])]
    if not all(_finished(s, total) for _, s in sources):
        return 0
    picked = selection_candidates(
        [(c, s.get_trials(deepcopy=False)) for c, s in sources],
        k=max(grid.selection_candidates, len(sources)))
    if not picked:
        return 0
    seeds = held_out_seeds(grid, SELECTION)
    for name, trial in picked:
        _enqueue(study, dict(trial.params), seeds, name)
    study.set_user_attr(_CANDIDATES, [name for name, _ in picked])
    study.set_user_attr(SEEDED, seeds)
    return validation_total(study)


def _seed_estimation(study: optuna.Study, grid: GridSettings) -> int:
    selection = _load(grid, Cell(**grid.extra["sources"][0]))
    if not validation_due(selection) or not _finished(selection, validation_total(selection)):
        return 0
    chosen = chosen_configuration(selection)
    if chosen is None:
        return 0
    name, params = chosen
    seeds = held_out_seeds(grid)
    _enqueue(study, params, seeds, name)
    study.set_user_attr(_CANDIDATES, [name])
    study.set_user_attr(SEEDED, seeds)
    return validation_total(study)


def selection_candidates(sources: list[tuple[Cell, list[optuna.trial.FrozenTrial]]], *,
                         k: int) -> list[tuple[str, optuna.trial.FrozenTrial]]:
    """Up to ``k`` distinct configurations of the searches ``sources`` (a cell and its
    replicas), named ``<cell>#<number>``: each search's best, then each one's near miss
    (:func:`tasks.search.near_miss`), then the fastest others that reached the target, then
    the pruned ones of least value so far (the bound stopped them only for being slower)."""
    def pool(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
        done = [t for t in trials if t.value is not None]
        reached = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE
                   and reached_target(t)]
        pruned = [t for t in done if t.state == optuna.trial.TrialState.PRUNED]
        return (sorted(reached, key=lambda t: (t.value, t.number))
                + sorted(pruned, key=lambda t: (t.value, t.number)))

    ranked = ([(c, best_trial(ts)) for c, ts in sources]
              + [(c, near_miss(ts, NEAR_MISS)) for c, ts in sources]
              + sorted(((c, t) for c, ts in sources for t in pool(ts)),
                       key=lambda ct: (ct[1].state != optuna.trial.TrialState.COMPLETE,
                                       ct[1].value, ct[0].replica, ct[1].number)))
    picked: list[tuple[str, optuna.trial.FrozenTrial]] = []
    for cell, trial in ranked:
        if trial is None or any(trial.params == t.params for _, t in picked):
            continue
        picked.append((f"{cell.key}#{trial.number}", trial))
    return picked[:k]


def chosen_configuration(selection: optuna.Study) -> tuple[str, dict[str, Any]] | None:
    """The selection study's choice: of its candidates, the one that reached the target on
    the most selection seeds, of least mean time among those (the first listed of equals);
    its name (``<cell>#<number>``) and parameters. None before it was seeded."""
    groups = [g for g in _groups(selection) if g]
    if not groups:
        return None
    best = min(range(len(groups)), key=lambda i: _selection_key(groups[i], i))
    return str(groups[best][0].user_attrs.get(VALIDATES, "")), dict(groups[best][0].params)


def _selection_key(group: list[optuna.trial.FrozenTrial], index: int) -> tuple[int, float, int]:
    mean = _mean(group)
    reached = sum(t.state == optuna.trial.TrialState.COMPLETE and reached_target(t)
                  for t in group)
    return -reached, float("inf") if mean is None else mean, index


def _enqueue(study: optuna.Study, params: dict[str, Any], seeds: list[int],
             validates: str) -> None:
    """``params`` once per seed (only the seeds not there yet: a rerun after a kill
    mid-way)."""
    there = {(t.user_attrs.get(VALIDATES), t.user_attrs.get(TRAIN_SEED))
             for t in study.get_trials(deepcopy=False)}
    for seed in (s for s in seeds if (validates, s) not in there):
        study.enqueue_trial(dict(params), skip_if_exists=False, user_attrs={
            TRAIN_SEED: seed, VALIDATES: validates})


def _candidates(study: optuna.Study) -> list[str]:
    """The search trials the study retrains, in order (``<cell>#<number>``); a study seeded
    before they were listed has its one, named by its trials."""
    listed = study.user_attrs.get(_CANDIDATES)
    if listed:
        return list(listed)
    return list(dict.fromkeys(str(t.user_attrs.get(VALIDATES, ""))
                              for t in study.get_trials(deepcopy=False)))[:1]


def validation_total(study: optuna.Study) -> int:
    """The trials the held-out study has or will have: its seeds for each configuration it
    retrains (0 before it is seeded)."""
    return len(study.user_attrs.get(SEEDED) or []) * max(1, len(_candidates(study)))


def validation_due(study: optuna.Study) -> bool:
    """Whether the held-out study has seeds to train (what it takes from had a configuration
    to retrain)."""
    return bool(study.user_attrs.get(SEEDED))


def validation_rows(storage: str, *, grid_name: str, first_seeds: int | None = None
                    ) -> list[dict[str, Any]]:
    """One row per estimation study of the grid (stages :data:`STAGES`): its cell, and each
    estimation seed's value, whether it reached the target (COMPLETE trials only) and what it
    took (``mechanism``: the trial's user attribute, None where absent); ``selection``: each
    candidate the selection stage retrained, with its seeds, seeds reached and mean there (the
    chosen one marked); ``replaced``: those listed before the chosen one (the search's best
    first: empty when it was chosen); ``retrained``: how many it retrained.

    ``first_seeds``: read only the first K estimation seeds of each cell, as a grid with
    ``validation_seeds=K`` trained them (the seeds are a prefix: :func:`held_out_seeds`)."""
    from tasks.mechanism import MECHANISM_ATTR  # here: tasks.mechanism imports tasks.answer,
    # which imports this module

    rows: list[dict[str, Any]] = []
    store, searched = storage_for(storage), _SearchTrials(storage, grid_name)
    for s in optuna.get_all_study_summaries(store, include_best_trial=False):
        attrs = s.user_attrs
        if attrs.get("grid") != grid_name or attrs.get("stage") not in STAGES:
            continue
        study = optuna.load_study(study_name=s.study_name, storage=store)
        seeds = list(attrs.get(SEEDED) or [])[:first_seeds]
        done = [t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
                and (first_seeds is None or int(t.user_attrs.get(TRAIN_SEED, -1)) in seeds)]
        validates = str(done[0].user_attrs.get(VALIDATES, "")) if done else ""
        selection = _selection_of(s.study_name, store, validates)
        rows.append({
            "network": int(attrs["network"]),
            "algorithm": str(attrs["algorithm"]) + (MATCHED_SUFFIX if attrs["stage"] == "matched"
                                                    else ""),
            "model": str(attrs["model"]), "study": s.study_name,
            "objective": study_objective(attrs),
            "values": {int(t.user_attrs[TRAIN_SEED]): float(t.value or 0.0) for t in done},
            "reached": {int(t.user_attrs[TRAIN_SEED]): reached_target(t) for t in done},
            "mechanism": {int(t.user_attrs[TRAIN_SEED]): t.user_attrs.get(MECHANISM_ATTR)
                          for t in done},
            "params": dict(done[0].params) if done else {},
            "validates": validates, "n_seeds": len(seeds), "selection": selection,
            "replaced": _before_chosen(selection),
            "retrained": len(selection),
            "unchanged_seeds": _unchanged_seeds(done),
            "search_shortfall": searched.shortfall(validates),
        })
    rows.sort(key=lambda r: (r["network"], r["model"], r["algorithm"]))
    return rows


def _selection_of(estimation: str, store: Any, chosen: str) -> list[dict[str, Any]]:
    """The candidates of the selection study beside an estimation study (a matched cell has
    none of its own: empty), as the report shows them."""
    name = estimation.rsplit("/", 1)[0] + f"/{SELECTION}"
    try:
        study = optuna.load_study(study_name=name, storage=store)
    except KeyError:
        return []
    return [{"validates": str(g[0].user_attrs.get(VALIDATES, "")), "n_seeds": len(g),
             "reached_seeds": sum(reached_target(t) for t in g
                                  if t.state == optuna.trial.TrialState.COMPLETE),
             "mean": _mean(g), "chosen": str(g[0].user_attrs.get(VALIDATES, "")) == chosen}
            for g in _groups(study) if g]


def _before_chosen(selection: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidates listed before the chosen one (the search's best first): what the
    choice replaced; empty when the search's best was chosen."""
    index = next((i for i, c in enumerate(selection) if c["chosen"]), 0)
    return selection[:index]


def _unchanged_seeds(done: list[optuna.trial.FrozenTrial]) -> int | None:
    """On how many of its held-out seeds the answering configuration stopped before its
    schedule changed the batch size or learning rate (it trained as plain SGD there); None
    when a trial does not say (a grid from before it was recorded)."""
    known = [t.user_attrs[SCHEDULE_ATTR] for t in done if SCHEDULE_ATTR in t.user_attrs]
    return sum(epoch is None for epoch in known) if done and len(known) == len(done) else None


class _SearchTrials:
    """The grid's search trials, loaded once per search study, by the name a held-out trial
    records of the one it retrains (``<cell>#<number>``)."""

    def __init__(self, storage: str, grid_name: str) -> None:
        self.storage, self.grid_name = storage, grid_name
        self.trials: dict[str, dict[int, optuna.trial.FrozenTrial]] = {}

    def shortfall(self, validates: str) -> float | None:
        """By how much that search trial missed the search's target on its one seed, within
        the search's epochs: 0 when it reached it (a near miss chosen is above 0); None when
        it did not complete (a pruned runner-up) or is not there."""
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


def _groups(study: optuna.Study) -> list[list[optuna.trial.FrozenTrial]]:
    """The study's trials per configuration retrained, in the order listed."""
    trials = study.get_trials(deepcopy=False)
    return [[t for t in trials if str(t.user_attrs.get(VALIDATES, "")) == name]
            for name in _candidates(study)] or [trials]


def _mean(group: list[optuna.trial.FrozenTrial]) -> float | None:
    """The mean value of the group's COMPLETE trials; None when none completed."""
    values = [float(t.value) for t in group
              if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    return sum(values) / len(values) if values else None


def runner_up_answer(study: optuna.Study, *, search_best: int | None) -> int | None:
    """When the estimation study trains another configuration than its search's best (number
    ``search_best``; the selection chose a runner-up, a near miss or a replica's), the number
    of its trial that reached the target fastest: a model of that configuration trained to
    the target. None when the search's best answers, or nothing reached the target."""
    candidates = _candidates(study)
    if not candidates or search_best is None:
        return None
    cell, _, number = candidates[0].rpartition("#")
    if Cell.from_key(cell).replica == 0 and number == str(search_best):
        return None
    reached = [t for t in study.get_trials(deepcopy=False)
               if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
               and reached_target(t)]
    return min(reached, key=lambda t: (t.value, t.number)).number if reached else None


def expected_trials(settings: GridSettings, cell: Cell, cells: list[Cell]) -> int:
    """The trials ``cell`` will have in all: a search's budget; a selection's candidates (at
    most) on the selection seeds; an estimation's or matched cell's estimation seeds."""
    if cell.stage == "search":
        return settings.trials_for(cell.model)
    if cell.stage == SELECTION:  # at most: fewer when the searches offer fewer distinct ones
        searches = len(sources_of(cell, cells))
        candidates = min(max(settings.selection_candidates, searches),
                         searches * settings.trials_for(cell.model))
        return candidates * settings.selection_seeds
    return settings.validation_seeds
