"""The ``tune`` flow: grid → cells → Optuna studies → trials on a Dask cluster → MLflow.

It only wires things: validate the parameters, open the session (the cluster and the clients),
submit one cell task per (network size × algorithm × model) with bounded concurrency, and
write the grid's summary.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.context import get_run_context
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.callables import parameter_docstrings

from damptune import interrupt
from damptune.validate import positive_float, positive_int
from flows.params import (
    Algorithms,
    DatasetName,
    Device,
    Epochs,
    GridName,
    Margin,
    Mode,
    ModelNames,
    Ms,
    Networks,
    NonNegativeFloat,
    NonNegativeInt,
    Objective,
    PositiveFloat,
    PositiveInt,
    Profile,
    Pruner,
    Sampler,
    Seed,
    SeedCount,
    Target,
    Trials,
)
from tasks import tracking
from tasks.cell import run_cell
from tasks.clusters import check_cluster
from tasks.console import keep_running_without_console
from tasks.env import check_environment
from tasks.grid import (
    ALGORITHMS,
    DEFAULT_EPOCHS,
    DEFAULT_SEARCH_MARGIN,
    DEFAULT_TARGETS,
    DEFAULT_TRIALS,
    MODEL_NAMES,
    Cell,
    GridSettings,
    cells_of,
)
from tasks.locations import check_locations
from tasks.publish import publish_report
from tasks.registry import publish_models
from tasks.report import GridIncomplete, check_run_dir, grid_rows, write_meta, write_summary
from tasks.search import check_grid_data, storage_for, with_storage_retries
from tasks.session import open_session
from tasks.stores import check_stores
from tasks.validation import (
    HELD_OUT_STAGES,
    matched_cells,
    selection_cells,
    sources_of,
    validation_settings,
)
from tasks.warmstart import neighbours

__all__ = ["tune", "resolve_locations", "grid_of", "stages", "flow_defaults", "flow_descriptions"]


def resolve_locations(settings: GridSettings) -> None:
    """Default run directory, Optuna storage and MLflow store (SQLite files in the run dir).

    A relative run directory (the default ``runs/<grid_name>`` too) is taken relative to the
    current working directory when this is called, never to where the package is installed:
    ``damptune tune`` writes under the directory it is run from, and a Prefect deployment's
    flow under its working directory (prefect.yaml's pull step: where it was deployed from).
    """
    run_dir = settings.run_dir or os.path.join("runs", settings.grid_name)
    settings.run_dir = run_dir = str(Path.cwd() / run_dir)  # an absolute one stays as it is
    settings.storage = settings.storage or f"sqlite:///{run_dir}/optuna.db"
    settings.tracking_uri = (settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                             or f"sqlite:///{run_dir}/mlflow.db")


@flow(name="tune", log_prints=True)
def tune(networks: Networks = [2, 8], algorithms: Algorithms = list(ALGORITHMS),
    models: ModelNames = list(MODEL_NAMES), dataset: DatasetName = "mnist1d",
    data_root: str | None = None, device: Device = "cpu", trials: Trials = DEFAULT_TRIALS,
    epochs: Epochs = DEFAULT_EPOCHS, target_accuracy: Target = DEFAULT_TARGETS,
    search_margin: Margin = DEFAULT_SEARCH_MARGIN, objective: Objective = "target",
    profile: Profile = "ddp-100g", mode: Mode = "centralized", per_worker_batch: PositiveInt = 32,
    seed: Seed = 0, data_seed: Seed = 0, sampler: Sampler = "auto", pruner: Pruner = "bound",
    warm_start: bool = True, eval_resolution: NonNegativeFloat = 0.02, overhead_ms: Ms = None,
    overhead_per_rank_ms: Ms = None, grid_name: GridName = "grid", run_dir: str | None = None,
    storage: str | None = None, tracking_uri: str | None = None, cluster: str = "local",
    max_concurrent_cells: PositiveInt = 2, max_concurrent_trials: PositiveInt = 1,
    checkpoint_seconds: PositiveFloat = 30.0, checkpoint_every: NonNegativeInt = 0,
    checkpoint_root: str | None = None, max_cluster_lifetime: str | None = None,
    trial_attempts: PositiveInt = 3, worker_wait: PositiveFloat = 600.0,
    workers_per_trial: NonNegativeInt | None = None, validation_seeds: SeedCount = 8,
    sampler_seed: Seed | None = None, system_metrics: bool = True) -> list[dict[str, Any]]:
    """Tune every cell's damping; one summary per cell, or ``GridIncomplete`` after it.

    Args:
        networks: network sizes of the cells, in ranks (integers >= 1), e.g. [2, 4, 8, 16].
        algorithms: dampers: geodamplr, cntsdamplr, geodamp, padadamp, adadamp, radadamp, sgd.
        models: mlp, cnn (CPU-sized) or wrn16_4 (Wide-ResNet-16-4, for GPUs).
        dataset: mnist1d, digits, synthetic, or cifar10 (read from data_root, never downloaded).
        data_root: directory of the CIFAR-10 python batches, for dataset cifar10 (else unused).
        device: where ranks train: cpu, cuda (a GPU per rank) or auto (CUDA if workers have it).
        trials: Optuna trials per search cell, in all (>= 1): one, or {model: trials} (else 8).
        epochs: training budget of a trial, in epochs (> 0): one number, or {model: epochs}.
        target_accuracy: test accuracy in (0, 1] that stops the clock: one, or {model: accuracy}.
        search_margin: accuracy a search trial must reach above the target, in [0, 1) (held-out 0).
        objective: target (simulated time to the target) or budget (of all epochs, if accurate).
        profile: a named network, e.g. ddp-100g (docs/results.md), or custom:GBPS:US.
        mode: centralized (parameter server), decentralized (all-reduce) or local (one process).
        per_worker_batch: examples per rank (>= 1); a cell's batch cap is network x this.
        seed: integer seed of the training (initial weights, data order) and of the sampler.
        data_seed: integer seed of the generated dataset (mnist1d, synthetic), kept as seed varies.
        sampler: auto (GP for up to two hyperparameters: every damper; TPE above), tpe or gp.
        pruner: bound (a trial stops past the cell's best time), hyperband, sha, or none.
        warm_start: true: a cell waits for its neighbour cells and first tries their best.
        eval_resolution: extra evaluations each time examples seen grow by this fraction (>= 0).
        overhead_ms: simulated overhead per update, ms (>= 0; None: the profile's).
        overhead_per_rank_ms: simulated overhead per update and rank, ms (>= 0; None: profile's).
        grid_name: names the grid's studies, MLflow experiment and run directory; no "/".
        run_dir: results directory (default runs/GRID_NAME; relative: under the working dir).
        storage: Optuna storage, any SQLAlchemy URL (default: SQLite optuna.db in run_dir).
        tracking_uri: MLflow URI (default: $MLFLOW_TRACKING_URI, else SQLite mlflow.db in run_dir).
        cluster: local (a LocalCluster per flow run), tcp://HOST:PORT, or a cluster YAML's path.
        max_concurrent_cells: cells trained at once (>= 1).
        max_concurrent_trials: trials of a cell trained at once (>= 1; 1 for exact repeats).
        checkpoint_seconds: seconds of training between a trial's checkpoints (> 0).
        checkpoint_every: model updates between a trial's checkpoints (0: by time only).
        checkpoint_root: path or fsspec URL of the checkpoints (default: the run directory).
        max_cluster_lifetime: e.g. "6h": trials checkpoint and stop before the cluster is this old.
        trial_attempts: tries of a trial that cluster faults interrupt, in one run (>= 1).
        worker_wait: seconds a trial waits for its workers before it is interrupted (> 0).
        workers_per_trial: Dask workers per trial (0: one per rank; None: docs/clusters.md).
        validation_seeds: estimation seeds each cell's chosen configuration trains on (0-100).
        sampler_seed: integer seed of the search's sampler (None: seed).
        system_metrics: true: MLflow's system metrics (CPU, memory, ...) on every trial's run.
    """
    return _tune(dict(locals()))


def _tune(params: dict[str, Any]) -> list[dict[str, Any]]:
    settings, cells = _settings(params)
    _prepare(settings, n_cells=len(cells))
    failures, not_started = _run_grid(
        settings, cells, max_concurrent_trials=params["max_concurrent_trials"],
        max_concurrent_cells=params["max_concurrent_cells"], cluster=params["cluster"])
    return _summarize(settings, cells, failures, not_started)


def _run_grid(settings: GridSettings, cells: list[Cell], *, cluster: str,
              max_concurrent_cells: int,
              max_concurrent_trials: int) -> tuple[list[str], list[str]]:
    """The cells, in one session on ``cluster`` sized for the largest network; the failures
    and the cells not started (:func:`_run_cells`)."""
    with (
        keep_running_without_console(get_run_logger().warning),  # its Prefect worker may die
        open_session(settings, key=_flow_run_key(), cluster=cluster,
                     n_workers=_cluster_size(settings, cells, at_once=max_concurrent_cells
                                             * max_concurrent_trials)) as session,
    ):
        return _run_cells(settings, cells, session_key=session.key,
                          max_concurrent_cells=max_concurrent_cells,
                          max_concurrent_trials=max_concurrent_trials)


def _cluster_size(settings: GridSettings, cells: list[Cell], *, at_once: int) -> int:
    """Workers the grid's session needs: the largest network's ranks, one worker each; with
    ``workers_per_trial`` N, N for each trial that trains at once (never more)."""
    largest = max(c.network for c in cells)
    if settings.mode == "local":  # trials train in this process: the cluster only idles
        return 1
    if not settings.workers_per_trial:
        return largest
    return at_once * settings.trial_workers(largest)


def _run_cells(settings: GridSettings, cells: list[Cell], *, session_key: str,
               max_concurrent_cells: int,
               max_concurrent_trials: int) -> tuple[list[str], list[str]]:
    """One cell task per cell, ``max_concurrent_cells`` at a time, in the grid's order; with
    warm start a cell starts once its neighbours finished (what seeds it never depends on
    timing). Once a stop is asked, no cell starts: a rerun runs them. The failures, as text,
    and the keys of the cells not started."""
    logger = get_run_logger()
    failures: list[str] = []
    not_started: list[str] = []
    pending = stages(settings, cells)
    running: dict[Any, Cell] = {}
    finished: set[Cell] = set()
    runner: ThreadPoolTaskRunner[Any]
    with ThreadPoolTaskRunner(max_workers=max_concurrent_cells) as runner:
        while pending or running:
            if interrupt.requested() and pending:  # opening them would only ask trial 0s
                not_started += [c.key for c in pending]
                logger.warning("stop requested (%s): %d cell(s) not started",
                               interrupt.requested(), len(pending))
                pending.clear()
                if not running:
                    break
            for cell in [c for c in pending if _ready(settings, c, cells, finished)]:
                if len(running) >= max_concurrent_cells:
                    break
                pending.remove(cell)
                running[runner.submit(run_cell, _cell_parameters(  # type: ignore[arg-type]
                    settings, cell, cells, session_key, max_concurrent_trials))] = cell
            future = next(iter(as_completed(list(running))))
            cell = running.pop(future)
            finished.add(cell)
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 - reported after the others finish
                failures.append(f"{cell.key}: {exc}")
                logger.error("cell %s failed: %s", cell.key, exc)
    return failures, not_started


def stages(settings: GridSettings, cells: list[Cell]) -> list[Cell]:
    """The search cells (the baseline's replicas among them), then (with
    ``validation_seeds``) each one's selection and estimation (``validation``) cells and the
    matched cells (geodamp with the baseline's choice: :func:`tasks.validation.matched_cells`)."""
    if not settings.validation_seeds:
        return list(cells)
    chosen = selection_cells(cells)
    return (list(cells) + chosen
            + [dataclasses.replace(c, stage="validation") for c in chosen]
            + matched_cells(cells))


def _ready(settings: GridSettings, cell: Cell, cells: list[Cell], finished: set[Cell]) -> bool:
    """A held-out cell waits for the cells it retrains from (:func:`sources_of`); a search
    cell, with warm start, for its neighbours (a replica of the baseline for none)."""
    if cell.stage != "search":
        return set(sources_of(cell, cells)) <= finished
    return not _warm(settings, cell) or set(neighbours(cell, cells)) <= finished


def _warm(settings: GridSettings, cell: Cell) -> bool:
    """Whether ``cell`` is warm-started: a search cell, not a repeat of the baseline's
    search (those are independent)."""
    return settings.warm_start and cell.stage == "search" and not cell.replica


def _cell_parameters(settings: GridSettings, cell: Cell, cells: list[Cell], session_key: str,
                     max_concurrent_trials: int) -> dict[str, Any]:
    search = cell.stage == "search"
    seeds = neighbours(cell, cells) if _warm(settings, cell) else []
    return {"settings": settings.to_dict() if search else validation_settings(
                settings, sources=sources_of(cell, cells), stage=cell.stage),
            "cell_key": cell.key, "cell": _as_dict(cell),
            "session_key": session_key, "max_concurrent_trials": max_concurrent_trials,
            "seed_cells": [_as_dict(c) for c in seeds]}


def _as_dict(cell: Cell) -> dict[str, Any]:
    return {"network": cell.network, "algorithm": cell.algorithm, "model": cell.model,
            "stage": cell.stage, "replica": cell.replica}


def flow_defaults() -> dict[str, Any]:
    """The flow's parameters and their defaults."""
    return {name: p.default for name, p in inspect.signature(tune.fn).parameters.items()}


def flow_descriptions() -> dict[str, str]:
    """The flow's parameters' descriptions, as Prefect reads them for the deployment's
    parameter schema (from the docstring's ``Args:``)."""
    return parameter_docstrings(inspect.getdoc(tune.fn))


def grid_of(params: dict[str, Any]) -> tuple[GridSettings, list[Cell]]:
    """The settings (locations resolved) and cells of a run of the flow with ``params`` (the
    flow's defaults for the others), validated before any work starts."""
    return _settings({**flow_defaults(), **params})


def _settings(params: dict[str, Any]) -> tuple[GridSettings, list[Cell]]:
    """The grid's settings and cells, validated before any work starts."""
    check_environment()  # DAMPTUNE_* variables (tasks.env): a bad one refused here
    lifetime = interrupt.parse_duration(params["max_cluster_lifetime"])
    checkpoint_seconds = positive_float("checkpoint_seconds", params["checkpoint_seconds"],
                                        "a positive number")
    settings = GridSettings(
        grid_name=params["grid_name"], dataset=params["dataset"],
        data_root=params["data_root"] or "", device=params["device"], trials=params["trials"],
        epochs=params["epochs"], target_accuracy=params["target_accuracy"],
        search_margin=params["search_margin"], objective=params["objective"],
        profile=params["profile"], mode=params["mode"],
        per_worker_batch=params["per_worker_batch"], seed=params["seed"],
        data_seed=params["data_seed"],
        sampler=params["sampler"], pruner=params["pruner"], warm_start=params["warm_start"],
        eval_resolution=params["eval_resolution"], overhead_ms=params["overhead_ms"],
        overhead_per_rank_ms=params["overhead_per_rank_ms"], run_dir=params["run_dir"] or "",
        storage=params["storage"] or "", tracking_uri=params["tracking_uri"] or "",
        checkpoint_seconds=checkpoint_seconds,
        checkpoint_every=params["checkpoint_every"],
        checkpoint_root=params["checkpoint_root"] or "",
        max_cluster_lifetime=lifetime or 0.0, trial_attempts=params["trial_attempts"],
        worker_wait=params["worker_wait"], validation_seeds=params["validation_seeds"],
        sampler_seed=params["sampler_seed"], system_metrics=params["system_metrics"],
    )
    positive_int("max_concurrent_cells", params["max_concurrent_cells"])
    positive_int("max_concurrent_trials", params["max_concurrent_trials"])
    settings.workers_per_trial = _workers_per_trial(params)
    check_cluster(params["cluster"])  # a bad cluster YAML: refused before grid.json is written
    cells = cells_of(networks=params["networks"], algorithms=params["algorithms"],
                     models=params["models"], settings=settings)
    resolve_locations(settings)
    check_locations(settings)
    return settings, cells


def _workers_per_trial(params: dict[str, Any]) -> Any:
    """``workers_per_trial`` as given; None: on ``cluster="local"`` on CPU in centralized mode
    the machine's cores shared by the trials that train at once (at least 1), since P ranks
    on fewer cores only take turns; elsewhere 0, one worker per rank, as on a real cluster."""
    given = params["workers_per_trial"]
    if given is not None:
        return given
    if (params["cluster"], params["device"], params["mode"]) != ("local", "cpu", "centralized"):
        return 0
    at_once = params["max_concurrent_cells"] * params["max_concurrent_trials"]
    return max(1, (os.cpu_count() or 1) // at_once)


def _prepare(settings: GridSettings, *, n_cells: int) -> None:
    """Signals, the run directory's metadata, and both stores (created once, before cells
    write to them concurrently)."""
    logger = get_run_logger()
    interrupt.clear()
    interrupt.install_sigterm_handler()  # a SIGTERM checkpoints the trials, then stops
    logger.info("grid %s: %d cells x %s trials; run dir %s; optuna %s; mlflow %s",
                settings.grid_name, n_cells, settings.trials, settings.run_dir,
                tracking.redact(settings.storage), tracking.redact(settings.tracking_uri))
    check_run_dir(settings.run_dir, settings.grid_name)  # another grid's run dir: refused
    check_stores(settings)  # a full disk, a corrupt store, MLflow down: before any write
    os.makedirs(settings.run_dir, exist_ok=True)  # the SQLite stores' directory
    storage_for(settings.storage)
    with_storage_retries(lambda: check_grid_data(settings))  # a rerun on other data: refused
    write_meta(settings.run_dir, {"grid_name": settings.grid_name,
                                  "storage": tracking.redact(settings.storage),
                                  "tracking_uri": tracking.redact(settings.tracking_uri),
                                  "checkpoint_root": settings.checkpoint_root,
                                  "prefect_api_url": os.environ.get("PREFECT_API_URL", "")})
    tracking.experiment_id(tracking.client_for(settings.tracking_uri),
                           grid_name=settings.grid_name,
                           artifact_root=f"{settings.run_dir}/mlartifacts")


def _flow_run_key() -> str:
    """This flow run's id (the session's key), or a fresh one outside a flow run."""
    try:
        return str(get_run_context().flow_run.id)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001
        return uuid.uuid4().hex


def _summarize(settings: GridSettings, cells: list[Cell], failures: list[str],
               not_started: list[str]) -> list[dict[str, Any]]:
    """The grid's rows: written to the run directory, MLflow and a Prefect artifact, with the
    report (ranking and figures, :mod:`tasks.publish`); then :class:`GridIncomplete` if trials
    failed or were left interrupted, cells stopped, or cells were not started (a stop came
    first)."""
    logger = get_run_logger()
    keys = {c.key for c in cells}
    rows = [r for r in grid_rows(settings.storage, grid_name=settings.grid_name)
            if f"n{r['network']}/{r['algorithm']}/{r['model']}" in keys]
    csv_path, md_path = write_summary(rows, settings.run_dir)
    client, summary_run = tracking.client_for(settings.tracking_uri), None
    try:
        summary_run = tracking.with_retries(lambda: tracking.log_grid_summary(
            client, tracking.experiment_id(client, grid_name=settings.grid_name,
                                           artifact_root=f"{settings.run_dir}/mlartifacts"),
            grid_name=settings.grid_name, rows=rows, files=(csv_path, md_path)),
            what="logging the grid's summary")
    except tracking.TrackingUnavailable as exc:  # the summary files are kept in the run dir
        logger.warning("%s", exc)
    with open(md_path) as f:
        create_markdown_artifact(markdown=f"# Grid `{settings.grid_name}`\n\n" + f.read(),
                                 key=f"summary-{settings.grid_name}".lower().replace("_", "-"))
    # the ranking and figures: files, MLflow, Prefect artifacts (a failure is only a warning)
    publish_report(settings, rows, client=client, summary_run_id=summary_run)
    if summary_run:  # MLflow answers: the registry's best per (network, model)
        publish_models(settings, rows, client=client)
    validated = [r for stage in HELD_OUT_STAGES
                 for r in grid_rows(settings.storage, grid_name=settings.grid_name, stage=stage)]
    validated += [r for r in grid_rows(settings.storage, grid_name=settings.grid_name,
                                       replicas=True) if r["replica"]]  # the baseline's repeats
    if failures or not_started or any(r["n_failed"] or r["n_interrupted"]
                                      for r in rows + validated):
        incomplete = GridIncomplete(rows, failures, validated, not_started)
        logger.error("%s%s", incomplete, f"; stop requested: {interrupt.requested()}"
                     if interrupt.requested() else "")
        raise incomplete
    return rows
