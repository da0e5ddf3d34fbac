"""Optuna side of a cell: the study, its sampler and pruner, and the damper's search space."""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

from damptune import DAMPERS, ConfigError, Param
from damptune.config import cap_for
from tasks.env import sqlite_timeout
from tasks.grid import Cell, GridSettings
from tasks.retries import retry
from tasks.samplers import NoRepeatSampler, PrunedSeenSampler
from tasks.sqlite import use_wal
from tasks.stores import StoreFault, check_sqlite

__all__ = [
    "summarize",
    "engine_kwargs_for",
    "storage_for", "study_name", "open_study", "distributions", "study_space", "FINISHED",
    "best_value", "best_trial", "reached_target", "TARGET_CONSTRAINT",
    "finished_in_grid", "finished_per_cell", "check_grid_data", "study_objective",
    "sampler_for", "sampler_kind",
    "pruner_for",
    "pruner_acts_on_reports",
    "trial_seed", "with_storage_retries",
    "StorageUnavailable",
]

FINISHED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)
T = TypeVar("T")
LR_PARAM = Param("lr", 1e-3, 0.5, log=True, doc="learning rate (the sgd baseline's only knob)")


# one storage (a SQLAlchemy engine) per URL and process, shared by every session's threads
_STORAGES: dict[str, optuna.storages.BaseStorage] = {}
_LOCK = threading.Lock()


def engine_kwargs_for(url: str) -> dict[str, Any]:
    """The SQLAlchemy engine's arguments of the grid's storage at ``url``: SQLite's lock wait
    (:func:`tasks.env.sqlite_timeout`); none for another database."""
    return {"connect_args": {"timeout": sqlite_timeout()}} if url.startswith("sqlite") else {}


def storage_for(url: str) -> optuna.storages.BaseStorage:
    """One storage object per URL in this process, shared by its threads (schema made once).

    SQLite waits up to ``$DAMPTUNE_SQLITE_TIMEOUT`` seconds (default 60) for a lock instead
    of failing at once when cells write together; past that, :func:`with_storage_retries`.
    A SQLite file is put in WAL mode (:mod:`tasks.sqlite`).
    A SQLite file that is not a sound database is a :class:`tasks.stores.StoreFault` naming
    it (left as it is).
    """
    from sqlalchemy.exc import DatabaseError

    with _LOCK:
        if url not in _STORAGES:
            use_wal(url, timeout=sqlite_timeout())  # a SQLite file: readers and writers apart
            try:
                _STORAGES[url] = _rdb_storage(url)
            except DatabaseError:
                check_sqlite(url, param="storage", what="Optuna's storage")  # a corrupt file
                raise
        return _STORAGES[url]


def _rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage at ``url``, opened again when another process made its schema at the
    same moment: Optuna's first opening of a new database is not atomic, and of two runs
    started at once the second to create a table or stamp the schema's version failed
    (OperationalError ``table ... already exists``, IntegrityError on ``alembic_version``)."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    return retry(lambda: optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs_for(url)),
                 transient=lambda exc: isinstance(exc, IntegrityError | OperationalError),
                 attempts=3, delay=0.2)


def study_name(settings: GridSettings, cell: Cell) -> str:
    """Deterministic: ``<grid name>/<cell key>``; reruns find the same study."""
    return f"{settings.grid_name}/{cell.key}"


def study_space(study: optuna.Study,
                space: dict[str, BaseDistribution]) -> dict[str, BaseDistribution]:
    """``space``, but a parameter the study's trials recorded on another scale keeps the
    recorded distribution. Optuna refuses a parameter another ``log`` setting within one study,
    and a grid an earlier damptune searched (``geodamp``'s ``delay`` was linear) must rerun as
    it ran: the same trials asked. Any other difference (a range clipped to another budget)
    takes ``space``."""
    recorded: dict[str, BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            recorded.setdefault(name, distribution)
    return {name: _kept_scale(recorded.get(name), d) for name, d in space.items()}


def _kept_scale(old: BaseDistribution | None, new: BaseDistribution) -> BaseDistribution:
    if (isinstance(new, FloatDistribution | IntDistribution) and type(old) is type(new)
            and old.log != new.log):
        return old
    return new


def distributions(settings: GridSettings, cell: Cell) -> dict[str, BaseDistribution]:
    """The damper's declared space, clipped to the trial budget and the cell's cap."""
    cap = cap_for(cell.network, settings.per_worker_batch)
    space = DAMPERS[cell.algorithm].space(max_epochs=settings.epochs_for(cell.model)) or (
        LR_PARAM,)
    out: dict[str, BaseDistribution] = {}
    for p in space:
        high = min(p.high, cap) if p.unit == "examples" else p.high
        low = min(p.low, high)
        if p.integer:
            out[p.name] = IntDistribution(int(math.ceil(low)), int(high), log=p.log)
        else:
            out[p.name] = FloatDistribution(float(low), float(high), log=p.log)
    return out


def trial_seed(seed: int, number: int, study: str = "") -> int:
    """The sampler's seed for trial ``number`` of ``study``: a function of the grid seed, the
    study and the number only, so a killed and resumed grid asks the same hyperparameters for
    each trial (and cells with the same search space do not all try the same points)."""
    digest = hashlib.sha256(f"damptune:{seed}:{study}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def sampler_for(settings: GridSettings, number: int = 0, study: str = "",
                dimensions: int = 1) -> optuna.samplers.BaseSampler:
    """The cell's sampler, seeded per trial. ``auto``: a Gaussian process for a
    ``GP_MAX_DIMENSIONS``-dimensional space or smaller, TPE above (``bench/search_efficiency.py
    --samplers auto,tpe,gp`` compares them). Its first ``startup_trials`` trials (warm-start seeds
    count) are random; the rest are chosen by the model."""
    seed = trial_seed(settings.seed if settings.sampler_seed is None else settings.sampler_seed,
                      number, study)
    kind = sampler_kind(settings.sampler, dimensions)
    if kind == "gp":
        return NoRepeatSampler(PrunedSeenSampler(optuna.samplers.GPSampler(
            seed=seed, n_startup_trials=settings.startup_trials,
            warn_independent_sampling=False)))  # NoRepeatSampler says why, instead
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=settings.startup_trials)


# sampler="auto": GP up to this many hyperparameters (every damper's space), TPE above. GP
# found the CNN's 2-D adadamp best more often in 8 trials, and two pairs of default grids with
# it gave 1 and 3 contradictions, against 10, 17, 8 and 9 for four pairs with TPE for two; the
# last TPE pair and GP's second ran on the same tree and day: 9 against 3, each run's best in
# the other's tied-best set in 3 of 8 pairs for both (docs/pipeline.md, "The search")
GP_MAX_DIMENSIONS = 2


def sampler_kind(sampler: str, dimensions: int) -> str:
    """The sampler that ``sampler`` names for a space of ``dimensions`` hyperparameters
    (``auto`` is ``gp`` or ``tpe``)."""
    if sampler == "auto":
        return "gp" if dimensions <= GP_MAX_DIMENSIONS else "tpe"
    return sampler


# the pruners whose Optuna side acts on no report (``bound`` is the engine's max_time_sim): a
# trial's reports may then reach Optuna with its ranks' next segment, not at each evaluation
PRUNERS_WITHOUT_REPORTS = ("none", "bound")


def pruner_acts_on_reports(pruner: str) -> bool:
    """Whether the cell's Optuna pruner stops trials on their reports (then each regular
    evaluation ends the ranks' segment, so the pruner sees it before training goes on)."""
    return pruner not in PRUNERS_WITHOUT_REPORTS


def pruner_for(settings: GridSettings, n_train: int, *,
               epochs: float) -> optuna.pruners.BasePruner:
    """Optuna's pruner of the cell (the ``bound`` rule is the engine's ``max_time_sim``, set by
    the trial). Resources are examples seen: ``eval_every`` epochs at least, the whole budget
    at most; the values are the objective so far (:func:`tasks.objective.value_so_far`)."""
    if not pruner_acts_on_reports(settings.pruner):
        return optuna.pruners.NopPruner()
    min_resource = int(n_train * settings.eval_every)
    if settings.pruner == "sha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=min_resource,
                                                      reduction_factor=3)
    return optuna.pruners.HyperbandPruner(
        min_resource=min_resource, max_resource=int(n_train * epochs),
        reduction_factor=3,
    )


def open_study(settings: GridSettings, cell: Cell, *, n_train: int) -> optuna.Study:
    """Create or load the cell's study (minimize simulated seconds to the target)."""
    study = optuna.create_study(
        study_name=study_name(settings, cell),
        storage=storage_for(settings.storage),
        direction="minimize",
        sampler=sampler_for(settings),
        pruner=pruner_for(settings, n_train, epochs=settings.epochs_for(cell.model)),
        load_if_exists=True,
    )
    attrs = study.user_attrs  # one read of the storage: each access of the property reads it
    _check_same_data(study.study_name, attrs, settings)
    for key, value in {"grid": settings.grid_name, "objective": settings.objective,
                       "network": cell.network,
                       "algorithm": cell.algorithm, "model": cell.model,
                       "stage": cell.stage, "replica": cell.replica,
                       "dataset": settings.dataset,
                       "data_seed": settings.data_seed, "profile": settings.profile,
                       "target_accuracy": settings.target_of(cell)}.items():
        if attrs.get(key) != value:
            study.set_user_attr(key, value)
    return study


def check_grid_data(settings: GridSettings) -> None:
    """Refuse, before any work, a rerun of a grid on other data than its studies' trials
    (another ``data_seed``) or with another ``objective``: their values would be compared
    with each other."""
    prefix = f"{settings.grid_name}/"
    for s in storage_for(settings.storage).get_all_studies():
        if s.study_name.startswith(prefix):
            _check_same_data(s.study_name, s.user_attrs, settings)


def _check_same_data(name: str, user_attrs: dict[str, Any], settings: GridSettings) -> None:
    recorded = user_attrs.get("data_seed")
    if recorded is not None and recorded != settings.data_seed:
        raise ConfigError("data_seed", settings.data_seed,
                          f"{recorded}, the data_seed of study {name!r}'s trials",
                          "Use another grid_name, with its own run_dir, for other data.")
    _check_same_objective(name, user_attrs, settings)


def study_objective(user_attrs: dict[str, Any]) -> str:
    """The objective a study's values are of (its user attribute; ``"target"`` for a study
    from before the option: the only objective there was)."""
    return str(user_attrs.get("objective", "target"))


def _check_same_objective(name: str, user_attrs: dict[str, Any],
                          settings: GridSettings) -> None:
    """A study's values are of one objective: a run with another is refused, the study kept
    (a study from before the option, with attributes but no ``objective``, timed the target)."""
    recorded = study_objective(user_attrs) if user_attrs else None  # None: a new study
    if recorded is not None and recorded != settings.objective:
        raise ConfigError("objective", settings.objective,
                          f"{recorded!r}, the objective of study {name!r}'s trials",
                          "Use another grid_name, with its own run_dir, for another objective.")


# A COMPLETE trial's Optuna constraint (``Trial.set_constraint``): target − best test
# accuracy, 0 when it reached the target. Feasible (≤ 0) means it reached the target, and a
# feasible trial beats any infeasible one: in ``study.best_trial``, in TPE's and GP's models,
# in the bound, the warm start and the report.
TARGET_CONSTRAINT = "target_shortfall"


def reached_target(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a COMPLETE trial reached its target (no constraint above 0)."""
    return all(v <= 0 for v in trial.constraints.values())


def best_trial(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """The cell's best COMPLETE trial: the fastest of those that reached the target, or, when
    none did, the one with the least value (it is reported as not reached); None before the
    first COMPLETE trial."""
    complete = [t for t in trials
                if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    return min(complete, key=lambda t: (not reached_target(t), t.value, t.number),
               default=None)


# accuracy by which a COMPLETE trial may have missed the target and still count as a near
# miss (:func:`near_miss`): retrained on the held-out seeds beside its search's best
# (tasks.validation), tried by its neighbours' warm start (tasks.warmstart). 0.015 by
# measurement: over four grids, every near miss 0.016-0.019 short reached the target on 1
# of 8 held-out seeds (9 of 9), and 24 of the 34 at 0.015 or less on most of them
NEAR_MISS = 0.015
# float rounding of ``target - accuracy`` (0.8 - 0.785 is 0.015000000000000013)
_ROUNDING = 1e-9


def near_miss(trials: list[optuna.trial.FrozenTrial],
              margin: float = NEAR_MISS) -> optuna.trial.FrozenTrial | None:
    """The fastest COMPLETE trial that missed the target by at most ``margin`` and has a lesser
    value than the best (:func:`best_trial`, which reached it); None when there is none.
    Reaching the target is judged on the search's one training seed: such a trial often
    reaches it on others."""
    best = best_trial(trials)
    if best is None or best.value is None or not reached_target(best):
        return None
    near = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE
            and t.value is not None and t.value < best.value
            and 0 < max(t.constraints.values(), default=0.0) <= margin + _ROUNDING]
    return min(near, key=lambda t: (t.value, t.number), default=None)


def best_value(study: optuna.Study) -> float | None:
    """The least value of the study's COMPLETE trials that reached the target, or None before
    the first: the bound of the next trial (a trial that did not reach the target bounds
    nothing: another one, slower, may still reach it and win)."""
    values = [t.value for t in study.get_trials(deepcopy=False, states=(
        optuna.trial.TrialState.COMPLETE,)) if t.value is not None and reached_target(t)]
    return min(values) if values else None


def finished_in_grid(url: str, grid_name: str) -> int:
    """Finished trials of every cell of ``grid_name`` in the storage at ``url`` (``damptune
    tune``'s progress bar asks every 2 s): :func:`finished_per_cell`, added up."""
    return sum(finished_per_cell(url, grid_name).values())


def finished_per_cell(url: str, grid_name: str) -> dict[str, int]:
    """Finished trials of each cell of ``grid_name`` in the storage at ``url``, by cell key
    (``n2/geodamp/mlp``, ``n2/geodamp/mlp/validation``); a cell without any is absent. One
    query: through Optuna's API, which loads every study and every trial with its reports, a
    progress bar took a fifth of the flow process's CPU in a default grid."""
    import json

    import sqlalchemy

    store = storage_for(url)
    assert isinstance(store, optuna.storages.RDBStorage)  # storage_for makes one
    query = sqlalchemy.text(
        "SELECT studies.study_name, COUNT(trials.trial_id) FROM studies"
        " JOIN study_user_attributes AS a ON a.study_id = studies.study_id"
        " JOIN trials ON trials.study_id = studies.study_id"
        " WHERE a.key = 'grid' AND a.value_json = :grid AND trials.state IN :states"
        " GROUP BY studies.study_name"
    ).bindparams(sqlalchemy.bindparam("states", expanding=True))
    with store.engine.connect() as connection:
        rows = connection.execute(query, {"grid": json.dumps(grid_name),
                                          "states": [s.name for s in FINISHED]}).all()
    return {name.removeprefix(f"{grid_name}/"): int(count) for name, count in rows}


def with_storage_retries(fn: Callable[[], T], *, attempts: int = 5, delay: float = 0.5) -> T:
    """Retry an Optuna storage call while the database is briefly unreachable or locked;
    then a clear error. Bad input is not retried.

    Transient: SQLAlchemy's ``OperationalError`` (connection refused or lost, database
    locked), raised as it is or wrapped by Optuna in ``StorageInternalError`` (a failed
    commit, rolled back: the retry does not write twice).
    """
    from sqlalchemy.exc import OperationalError

    def cause(exc: Exception) -> BaseException | None:
        if isinstance(exc, OperationalError):
            return exc
        if isinstance(exc, optuna.exceptions.StorageInternalError) and isinstance(
                exc.__cause__, OperationalError):
            return exc.__cause__
        return None

    return retry(fn, transient=lambda exc: cause(exc) is not None,
                 give_up=lambda exc: StorageUnavailable(
                     f"the Optuna storage did not answer after {attempts} attempts: "
                     f"{str(cause(exc)).splitlines()[0]}. Nothing was lost; rerun when it is "
                     "back."),
                 attempts=attempts, delay=delay)


class StorageUnavailable(StoreFault):
    """The Optuna storage stayed unreachable through the retries (a fault of the database,
    not of the input)."""


def summarize(study: optuna.Study, cell: Cell) -> dict[str, Any]:
    """Best hyperparameters and value, the trial counts of one cell, and how many distinct
    values its finished trials have (to 6 significant digits): ``distinct_values`` 1 of
    ``n_values`` > 1 is a flat search."""
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = best_trial(trials)
    values = [t.value for t in trials if t.value is not None and t.state.is_finished()]
    return {
        "network": cell.network,
        "algorithm": cell.algorithm,
        "model": cell.model,
        "study": study.study_name,
        "best_params": dict(best.params) if best else {},
        "best_value": best.value if best else None,
        "best_trial": best.number if best else None,
        "reached": reached_target(best) if best else None,
        "n_complete": len(complete),
        "n_pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in trials),
        "n_failed": sum(t.state == optuna.trial.TrialState.FAIL for t in trials),
        "n_interrupted": sum(t.state == optuna.trial.TrialState.RUNNING for t in trials),
        # a search whose trials all have one value: its hyperparameters had no effect here
        "distinct_values": len({float(f"{v:.6g}") for v in values}),
        "n_values": len(values),
    }
