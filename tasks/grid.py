"""The grid: cells (network size × algorithm × model) and the settings shared by their trials."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from damptune import DAMPERS, ConfigError
from damptune.netmodel import DEFAULT_PROFILE, get_profile
from damptune.validate import (
    choice,
    non_negative_float,
    number_in,
    positive_float,
    positive_int,
    seed_int,
    workers_for_ranks,
)
from models import DATASETS, MODELS, check_dataset
from tasks.choices import GRID_DEVICES, GRID_MODES, OBJECTIVES, PRUNERS, SAMPLERS

__all__ = ["Cell", "GridSettings", "checkpoint_path", "cells_of", "shared_across_networks",
           "share_rows", "never_grows", "replicas_of", "ALGORITHMS", "MODEL_NAMES",
           "DEFAULT_TARGETS", "DEFAULT_EPOCHS", "DEFAULT_TRIALS", "PRUNERS", "GRID_DEVICES"]

ALGORITHMS = ("geodamplr", "cntsdamplr", "geodamp", "padadamp", "adadamp", "radadamp")
MODEL_NAMES = ("mlp", "cnn")
# reached after about 2-4 epochs of MNIST-1D at batch 32: the objective tells trials apart
# Chosen by measurement (docs/results.md): the test accuracy the single-process
# baseline (plain SGD, batch 32, lr 0.05, momentum 0.9) reaches at about 90 % of its budget of
# DEFAULT_EPOCHS on MNIST-1D: near the plateau of the budget, where the damping of the batch
# size matters. wrn16_4 (CIFAR-10, GPU) is not measured here.
DEFAULT_TARGETS = {"mlp": 0.62, "cnn": 0.87, "wrn16_4": 0.9}
DEFAULT_EPOCHS = {"mlp": 12.0, "cnn": 10.0, "wrn16_4": 30.0}
# Trials per search cell. The MLP's 8 left its answer to the search's luck: two grids of
# seeds 0 and 1 ordered adadamp and padadamp the opposite ways (6 contradictions on the MLP's
# 4 pairs); with 16, none, and each run's best is tied-best in the other at every size
# (`python -m bench answer_stability --models mlp --trials 8` / `--trials 16`; docs/results.md).
# An MLP trial costs a third of a CNN one. The CNN keeps 8: three grids with 12 against three
# with 8 gave 14 contradictions in their three pairs against 1 (docs/results.md): its searches
# miss by their one seed's gate, not by too few trials. A model a dict does not name (one
# added to the registry, say) gets OTHER_TRIALS.
# Since the held-out stages choose among a search's 3 fastest configurations on selection seeds
# (and the baseline is searched 4 times), the MLP's search has 12: the default grid's make run,
# with 16, took 2195 s of its 1800 s budget (bench/results/make-run.jsonl).
DEFAULT_TRIALS = {"mlp": 12, "cnn": 8, "wrn16_4": 8}
# accuracy above the target a search trial must reach (docs/pipeline.md, "The search")
DEFAULT_SEARCH_MARGIN = 0.01
OTHER_TRIALS = 8


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: a network size (ranks), a damping algorithm and a model."""

    network: int
    algorithm: str
    model: str
    # "search": the cell's Optuna search; "selection": its top configurations retrained on the
    # grid's selection seeds, to choose one (tasks.validation); "validation": the chosen one
    # trained on the estimation seeds, which no selection saw: the answer; "matched": geodamp
    # with the baseline's chosen factor and delay on the estimation seeds (the paper's matched
    # comparison: tasks.validation.matched_cells)
    stage: str = "search"
    # an independent repeat of a search (its own study, sampler seeds, no warm start): the
    # baseline is searched ``GridSettings.baseline_searches`` times (replicas 0 … R-1)
    replica: int = 0

    @property
    def key(self) -> str:
        base = f"n{self.network}/{self.algorithm}/{self.model}"
        if self.replica:
            base += f"/r{self.replica}"
        return base if self.stage == "search" else f"{base}/{self.stage}"

    @classmethod
    def from_key(cls, key: str) -> Cell:
        """The cell of ``key`` (``n<P>/<algorithm>/<model>[/r<replica>][/<stage>]``: a study's
        name less its ``<grid>/``)."""
        parts = key.split("/")
        replica = 0
        if len(parts) >= 4 and re.fullmatch(r"r[1-9][0-9]*", parts[3]):
            replica = int(parts.pop(3)[1:])
        if len(parts) not in (3, 4) or parts[0][:1] != "n" or not parts[0][1:].isdigit():
            raise ValueError(f"cell key {key!r}: expected "
                             "n<P>/<algorithm>/<model>[/r<replica>][/<stage>]")
        return cls(int(parts[0][1:]), parts[1], parts[2],
                   stage=parts[3] if len(parts) == 4 else "search", replica=replica)

    @property
    def searched(self) -> Cell:
        """The search cell of this cell (itself, for a search cell)."""
        return Cell(self.network, self.algorithm, self.model, replica=self.replica)


@dataclass
class GridSettings:
    """What every trial of a grid shares (units in names or comments)."""

    grid_name: str = "grid"
    dataset: str = "mnist1d"
    data_root: str = ""  # directory of a local dataset (cifar10's python batches); read here
    device: str = "cpu"  # one of GRID_DEVICES
    # per search cell, in all (a rerun tops up), for all models or per model
    trials: int | dict[str, int] = field(default_factory=lambda: dict(DEFAULT_TRIALS))
    # training budget per trial, in epochs, for all models or per model (it stops at the target)
    epochs: float | dict[str, float] = field(default_factory=lambda: dict(DEFAULT_EPOCHS))
    # test accuracy at which the objective's clock stops: one for all models, or per model
    target_accuracy: float | dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_TARGETS))
    # accuracy a search trial must reach above its model's target (its clock stops there); the
    # held-out seeds time the target itself (tasks.validation). A configuration that touches
    # the target only on a lucky seed does not win the search (docs/pipeline.md, "The search")
    search_margin: float = DEFAULT_SEARCH_MARGIN
    # what a trial's value is (tasks.objective): "target", the simulated time to the target;
    # "budget", the time of the whole budget, subject to the final accuracy reaching it
    objective: str = "target"
    profile: str = DEFAULT_PROFILE
    mode: str = "centralized"
    per_worker_batch: int = 32  # examples per rank; the cap is network × per_worker_batch
    initial_batch: int = 32  # B0 of the dampers that do not tune it (examples)
    lr: float = 0.05
    momentum: float = 0.9
    eval_every: float = 1.0  # epochs between the evaluations reported to Optuna
    # relative spacing (in examples seen) of the evaluations that resolve the objective
    eval_resolution: float = 0.02
    # and every update while the last evaluation was within this margin below the target
    eval_dense_margin: float = 0.06
    # orchestration overhead per update in the simulated time, ms (None: the profile's)
    overhead_ms: float | None = None
    overhead_per_rank_ms: float | None = None
    seed: int = 0  # of the training (initial weights, data order) and of the sampler
    data_seed: int = 0  # of the generated dataset (mnist1d, synthetic): fixed while seed varies
    sampler: str = "auto"  # "tpe", "gp", or "auto" (by the search space's size)
    startup_trials: int = 3  # random trials before the sampler's model (seeds count)
    pruner: str = "bound"
    warm_start: bool = True  # seed each cell with its finished neighbours' best (tasks.warmstart)
    run_dir: str = ""
    storage: str = ""  # Optuna storage URL
    tracking_uri: str = ""  # MLflow tracking URI
    metrics_every: int = 15  # log update metrics to MLflow every N updates (and on changes)
    checkpoint_every: int = 0  # updates between a trial's checkpoints (0: by time only)
    checkpoint_seconds: float = 30.0  # seconds of training between a trial's checkpoints
    deadline: float = 0.0  # time.time() by which trials checkpoint and stop (0: none)
    max_cluster_lifetime: float = 0.0  # seconds from the cluster's start (0: none); sets deadline
    trial_attempts: int = 3  # tries of a trial that cluster faults interrupt, in one run
    retry_backoff: float = 2.0  # seconds before the first retry of a trial; doubled each time
    worker_wait: float = 600.0  # seconds a trial waits for its workers before it is interrupted
    checkpoint_root: str = ""  # where trial checkpoints go: a path or fsspec URL (default run dir)
    # Dask workers a trial's P ranks run on: 0, one per rank (as a real cluster trains); N, at
    # most N, each taking several ranks' shares of the batch (centralized mode: the same math
    # and simulated time, without P processes taking turns on a few cores)
    workers_per_trial: int = 0
    # held-out training seeds on which each cell's best configuration is retrained after its
    # search (the answer is their mean, with a CI); the same seeds for every cell (0: none)
    validation_seeds: int = 8
    # the answer's configuration of a cell is chosen apart from its estimation: the search's
    # ``selection_candidates`` fastest configurations are retrained on ``selection_seeds``
    # seeds of their own, and the one of least mean is trained on the estimation seeds
    selection_candidates: int = 3
    selection_seeds: int = 2
    # independent searches of each algorithm whose batch never grows (the baseline): the
    # conservative comparison, damping against a well-tuned baseline (tasks.validation)
    baseline_searches: int = 4
    # MLflow's system metrics (CPU, memory, disk, network, GPU) on every trial's run
    system_metrics: bool = True
    sampler_seed: int | None = None  # of the search's sampler (None: seed)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def trial_workers(self, network: int) -> int:
        """The Dask workers a trial of ``network`` ranks holds (0 in local mode: none)."""
        if self.mode == "local":
            return 0
        return min(network, self.workers_per_trial) if self.workers_per_trial else network

    def trials_for(self, model: str) -> int:
        """Trials of a search cell of ``model``, in all (``OTHER_TRIALS`` for a model that a
        per-model ``trials`` does not name)."""
        if isinstance(self.trials, dict):
            return int(self.trials.get(model, OTHER_TRIALS))
        return int(self.trials)

    def epochs_for(self, model: str) -> float:
        if isinstance(self.epochs, dict):
            return float(self.epochs[model])
        return float(self.epochs)

    def target_for(self, model: str) -> float:
        if isinstance(self.target_accuracy, dict):
            return float(self.target_accuracy[model])
        return float(self.target_accuracy)

    def data_seed_of(self, cell: Cell, train_seed: int | None) -> int:
        """The dataset seed of a trial: the grid's ``data_seed`` in a search; a held-out
        training's own seed (data sampling varies with the training seed, as the answer's
        variance must: Bouthillier et al. 2021)."""
        if cell.stage == "search" or train_seed is None:
            return self.data_seed
        return int(train_seed)

    def target_of(self, cell: Cell) -> float:
        """The accuracy that stops a trial of ``cell``: its model's target, plus
        ``search_margin`` in a search cell (at most 1)."""
        target = self.target_for(cell.model)
        return min(1.0, target + self.search_margin) if cell.stage == "search" else target


def _check_margin(margin: Any) -> None:
    """``search_margin``: an accuracy from 0 to below 1 (a search's target is at most 1)."""
    accepted = "an accuracy margin in [0, 1) (a search trial's target: at most 1)"
    if non_negative_float("search_margin", margin, accepted) >= 1:
        raise ConfigError("search_margin", margin, accepted)


def cells_of(
    *, networks: list[int], algorithms: list[str], models: list[str], settings: GridSettings
) -> list[Cell]:
    """Validate the grid's parameters (before any work) and list its cells."""
    _check_lists(networks=networks, algorithms=algorithms, models=models)
    choice("dataset", settings.dataset, DATASETS)
    _check_data(settings.dataset, settings.data_root)
    choice("device", settings.device, GRID_DEVICES)
    seed_int("seed", settings.seed)
    seed_int("data_seed", settings.data_seed)
    if settings.sampler_seed is not None:
        seed_int("sampler_seed", settings.sampler_seed)
    if (isinstance(settings.validation_seeds, bool) or not isinstance(settings.validation_seeds,
                                                                       int)
            or not 0 <= settings.validation_seeds <= 100):
        raise ConfigError("validation_seeds", settings.validation_seeds,
                          "an integer from 0 (no validation) to 100")
    if not isinstance(settings.system_metrics, bool):
        raise ConfigError("system_metrics", settings.system_metrics, "true or false")
    _per_model("target_accuracy", settings.target_accuracy, models,
               lambda name, v: number_in(name, v, 0, 1, "an accuracy in (0, 1]"))
    _check_trials(settings.trials)
    _check_margin(settings.search_margin)
    choice("objective", settings.objective, OBJECTIVES)
    _per_model("epochs", settings.epochs, models,
               lambda name, v: positive_float(name, v, "a positive number of epochs"))
    positive_float("lr", settings.lr, "a positive learning rate")
    positive_int("per_worker_batch", settings.per_worker_batch, "a positive integer (examples)")
    positive_int("initial_batch", settings.initial_batch, "a positive integer (examples)")
    get_profile(settings.profile)
    choice("mode", settings.mode, GRID_MODES)
    positive_int("trial_attempts", settings.trial_attempts, "a positive integer (tries)")
    if settings.checkpoint_every != 0:
        positive_int("checkpoint_every", settings.checkpoint_every,
                     "an integer >= 0 (model updates between checkpoints; 0: by time only)")
    positive_float("worker_wait", settings.worker_wait, "a positive number of seconds")
    non_negative_float("retry_backoff", settings.retry_backoff, "seconds, 0 or more")
    choice("sampler", settings.sampler, SAMPLERS)
    positive_int("startup_trials", settings.startup_trials, "a positive number of trials")
    choice("pruner", settings.pruner, PRUNERS)
    non_negative_float("eval_resolution", settings.eval_resolution,
                       "a fraction >= 0 (0.02: the objective resolved to 2 %)")
    for name in ("overhead_ms", "overhead_per_rank_ms"):
        if getattr(settings, name) is not None:
            non_negative_float(name, getattr(settings, name), "milliseconds, 0 or more")
    _check_workers_per_trial(settings, networks)
    if not settings.grid_name or "/" in settings.grid_name:
        raise ConfigError("grid_name", settings.grid_name, "a non-empty name without '/'")
    for name in ("selection_candidates", "selection_seeds", "baseline_searches"):
        positive_int(name, getattr(settings, name), "a positive integer")
    smallest = min(networks)
    cells = [Cell(n, a, m) for n in sorted(set(networks)) for a in dict.fromkeys(algorithms)
             for m in dict.fromkeys(models)
             if n == smallest or not shared_across_networks(a, settings)]
    repeats = replicas_of(cells, settings)  # each right after its first search: the grid's
    # order is the order cells start in, and the baseline's selection waits for all four
    return [x for c in cells for x in [c, *(r for r in repeats if (r.network, r.algorithm, r.model)
                                             == (c.network, c.algorithm, c.model))]]


def replicas_of(cells: list[Cell], settings: GridSettings) -> list[Cell]:
    """The repeated searches of the baseline: replicas 1 … ``baseline_searches`` - 1 of every
    search cell of an algorithm that never grows (replica 0 is the cell itself)."""
    if not settings.validation_seeds:  # no held-out stage chooses among them
        return []
    return [Cell(c.network, c.algorithm, c.model, replica=r) for c in cells
            if never_grows(c.algorithm) and c.stage == "search" and not c.replica
            for r in range(1, settings.baseline_searches)]


def shared_across_networks(algorithm: str, settings: GridSettings) -> bool:
    """Whether ``algorithm`` trains the same at every network size: its batch never grows
    (``sgd``, and the learning-rate decays ``geodamplr``, ``cntsdamplr``) and B0 fits on one
    rank, so it trains on one rank whatever the cap. Such an algorithm is searched once per
    model, at the grid's smallest network, with the same trial budget as any cell, and the
    report shows that result at every size (a search per size gave the baseline several
    times the trials of the algorithms it is compared with)."""
    return never_grows(algorithm) and settings.initial_batch <= settings.per_worker_batch


def never_grows(algorithm: str) -> bool:
    """Its batch stays B0: ``sgd``, and the learning-rate decays (``lr_only`` dampers); a name
    that is no damper's (a report's ``geodamp-matched``) grows as its damper does."""
    damper = DAMPERS.get(algorithm.split("-")[0])
    return bool(getattr(damper, "lr_only", False)) or algorithm == "sgd"


def _check_workers_per_trial(settings: GridSettings, networks: list[int]) -> None:
    workers = settings.workers_per_trial
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError("workers_per_trial", workers,
                          "an integer >= 0 (0: one Dask worker per rank)")
    workers_for_ranks("workers_per_trial", workers, mode=settings.mode, ranks=max(networks),
                      ranks_name="the largest network", unset="0")


def _check_lists(*, networks: list[int], algorithms: list[str], models: list[str]) -> None:
    if not networks:
        raise ConfigError("networks", networks, "a non-empty list of network sizes (ranks)")
    try:
        for n in networks:
            positive_int("networks", n)
    except ConfigError:
        raise ConfigError("networks", networks, "network sizes that are integers >= 1") from None
    for name, values, known in (("algorithms", algorithms, DAMPERS), ("models", models, MODELS)):
        if not values:
            raise ConfigError(name, values, f"a non-empty list from {sorted(known)}")
        for value in values:
            choice(name, value, sorted(known))


def _check_data(dataset: str, data_root: str) -> None:
    """A dataset read from disk (cifar10) needs ``data_root`` holding its files, checked
    here, before any work: a trial never fails for want of them."""
    if dataset != "cifar10":
        return
    accepted = ("a directory holding the CIFAR-10 python batches (data_batch_1 ... 5, "
                "test_batch, or their cifar-10-batches-py folder) for dataset='cifar10'")
    if not data_root:
        raise ConfigError("data_root", data_root or None, accepted,
                          "damptune never downloads data: extract cifar-10-python.tar.gz and "
                          "pass its directory.")
    try:
        check_dataset(dataset, root=data_root)
    except ValueError as exc:
        raise ConfigError("data_root", data_root, accepted, str(exc)) from None


def _check_trials(trials: Any) -> None:
    """One count for every model, or {model: count} naming registered models (a model it
    does not name gets ``OTHER_TRIALS``)."""
    expected = "a positive integer (trials per cell)"
    if not isinstance(trials, dict):
        positive_int("trials", trials, expected)
        return
    unknown = sorted(str(m) for m in trials if m not in MODELS)
    if unknown:
        raise ConfigError("trials", trials, f"{{model: count}} for models among "
                          f"{sorted(MODELS)} (unknown {unknown})")
    for v in trials.values():
        positive_int("trials", v, expected)


def _per_model(name: str, value: Any, models: list[str],
               check: Callable[[str, Any], Any]) -> None:
    """``value`` is one value for all models, or a dict with one for every model."""
    if not isinstance(value, dict):
        check(name, value)
        return
    missing = [m for m in models if m not in value]
    if missing:
        raise ConfigError(name, value, f"one value for every model (missing {missing})")
    for v in value.values():
        check(name, v)


def share_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (one per cell: ``network``, ``algorithm``, ``model``) with each algorithm that
    was searched once (:func:`shared_across_networks`: its batch never grows, and the rows
    hold it at the smallest network only) copied to every other network size of the rows,
    marked ``shared_from`` (the cell it comes from). Judged from the rows, not from default
    settings: a grid whose B0 did not fit one rank searched it at every size, and nothing is
    copied."""
    networks = sorted({int(r["network"]) for r in rows})
    out = list(rows)
    for r in rows:
        if not never_grows(r["algorithm"]) or r["network"] != networks[0]:
            continue
        have = {(x["network"], x["model"]) for x in rows if x["algorithm"] == r["algorithm"]}
        out += [{**r, "network": n, "searched_network": r["network"],
                 "shared_from": f"n{r['network']}/{r['algorithm']}/{r['model']}"}
                for n in networks[1:] if (n, r["model"]) not in have]
    return out

def checkpoint_path(grid: GridSettings, c: Cell, number: int) -> str:
    """Where trial ``number`` of cell ``c`` checkpoints: under the grid's run directory, which
    belongs to one grid (``tasks.report.check_run_dir``), or under ``checkpoint_root``, which
    grids may share, in the grid's own folder there, so no grid resumes another's trial."""
    base = (os.path.join(grid.checkpoint_root, grid.grid_name) if grid.checkpoint_root
            else grid.run_dir)
    return os.path.join(base, "checkpoints", c.key, f"trial-{number}.pt")
