"""The ``tune`` flow: grid → cells → Optuna studies → trials on a Dask cluster → MLflow.

It only wires things: validate the parameters, open the cluster, submit one cell task per
(network size × algorithm × model) with bounded concurrency, and write the grid's summary.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.context import get_run_context
from prefect.task_runners import ThreadPoolTaskRunner

from damptune import ConfigError, interrupt
from tasks import tracking
from tasks.cell import run_cell
from tasks.clusters import open_cluster
from tasks.console import keep_running_without_console
from tasks.grid import ALGORITHMS, DEFAULT_TARGETS, MODEL_NAMES, GridSettings, cells_of
from tasks.report import grid_rows, write_meta, write_summary
from tasks.search import storage_for

__all__ = ["tune", "resolve_locations"]

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resolve_locations(settings: GridSettings) -> None:
    """Default run directory, Optuna storage and MLflow store (SQLite files in the run dir)."""
    run_dir = settings.run_dir or os.path.join("runs", settings.grid_name)
    if not os.path.isabs(run_dir):
        run_dir = os.path.join(PROJECT_ROOT, run_dir)
    settings.run_dir = run_dir
    settings.storage = settings.storage or f"sqlite:///{run_dir}/optuna.db"
    settings.tracking_uri = (settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                             or f"sqlite:///{run_dir}/mlflow.db")


@flow(name="tune", log_prints=True)
def tune(
    networks: list[int] = [2, 4, 8, 16],  # noqa: B006 - Prefect shows defaults in the UI
    algorithms: list[str] = list(ALGORITHMS),  # noqa: B006,B008
    models: list[str] = list(MODEL_NAMES),  # noqa: B006,B008
    dataset: str = "mnist1d",
    trials: int = 3,
    epochs: float = 6.0,
    target_accuracy: float | dict[str, float] = DEFAULT_TARGETS,  # noqa: B006
    profile: str = "decentralized-moderate",
    mode: str = "centralized",
    per_worker_batch: int = 32,
    seed: int = 0,
    sampler: str = "tpe",
    pruner: str = "hyperband",
    grid_name: str = "grid",
    run_dir: str | None = None,
    storage: str | None = None,
    tracking_uri: str | None = None,
    cluster: str = "local",
    max_concurrent_cells: int = 2,
    max_concurrent_trials: int = 1,
    checkpoint_seconds: float = 30.0,
    checkpoint_every: int = 0,
    checkpoint_root: str | None = None,
    max_cluster_lifetime: str | None = None,
) -> list[dict[str, Any]]:
    """Tune every cell's damping; return one summary per cell (best params, value, counts).

    Args:
        networks: cluster sizes (ranks) to tune for.
        algorithms: damping algorithms (see damptune.DAMPERS).
        models: model names (``mlp``, ``cnn``, ``wrn16_4``).
        trials: trials per cell in all: a rerun tops up to this number, never beyond.
        epochs: training budget of one trial, in epochs.
        target_accuracy: the objective is the simulated time to reach this test accuracy:
            one value, or one per model (default mlp 0.5, cnn 0.7, wrn16_4 0.9).
        profile: network profile of the simulated time.
        mode: ``centralized`` or ``decentralized`` data parallelism for the real training.
        per_worker_batch: examples per rank; a cell's cap is ``network × per_worker_batch``.
        run_dir: where studies, runs, checkpoints and summaries go (default ``runs/<grid>``).
        storage: Optuna storage URL (default SQLite in the run directory).
        tracking_uri: MLflow tracking URI (default ``$MLFLOW_TRACKING_URI``, else SQLite).
        cluster: ``local``, a scheduler address, or a cluster YAML file (see infra/).
        checkpoint_seconds: seconds of training between a trial's checkpoints (a kill loses at
            most this much work); ``checkpoint_every`` adds a cadence in updates.
        checkpoint_root: where trial checkpoints go: a path or any fsspec URL (``s3://…`` with
            s3fs installed); default the run directory.
        max_cluster_lifetime: e.g. ``"6h"``: trials checkpoint and stop, *interrupted*, before
            the cluster reaches this age (counted from the flow run's start); a rerun resumes
            them.
    """
    started = time.time()
    lifetime = interrupt.parse_duration(max_cluster_lifetime)
    if not (isinstance(checkpoint_seconds, int | float) and checkpoint_seconds > 0):
        raise ConfigError("checkpoint_seconds", checkpoint_seconds, "a positive number")
    margin = min(max(60.0, 2 * checkpoint_seconds), lifetime / 2) if lifetime else 0.0
    settings = GridSettings(
        grid_name=grid_name, dataset=dataset, trials=trials, epochs=epochs,
        target_accuracy=target_accuracy, profile=profile, mode=mode,
        per_worker_batch=per_worker_batch, seed=seed, sampler=sampler, pruner=pruner,
        run_dir=run_dir or "", storage=storage or "", tracking_uri=tracking_uri or "",
        checkpoint_seconds=float(checkpoint_seconds), checkpoint_every=int(checkpoint_every),
        checkpoint_root=checkpoint_root or "",
        deadline=started + lifetime - margin if lifetime else 0.0,
    )
    cells = cells_of(networks=networks, algorithms=algorithms, models=models, settings=settings)
    for name, value in (("max_concurrent_cells", max_concurrent_cells),
                        ("max_concurrent_trials", max_concurrent_trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "a positive integer")
    resolve_locations(settings)
    logger = get_run_logger()
    interrupt.clear()
    interrupt.install_sigterm_handler()  # a SIGTERM checkpoints the trials, then stops
    logger.info("grid %s: %d cells x %d trials; run dir %s; optuna %s; mlflow %s",
                grid_name, len(cells), trials, settings.run_dir,
                tracking.redact(settings.storage), tracking.redact(settings.tracking_uri))
    write_meta(settings.run_dir, {"grid_name": grid_name,
                                  "storage": tracking.redact(settings.storage),
                                  "tracking_uri": tracking.redact(settings.tracking_uri),
                                  "prefect_api_url": os.environ.get("PREFECT_API_URL", "")})
    try:
        pool_key = str(get_run_context().flow_run.id)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001
        pool_key = uuid.uuid4().hex
    # create both stores once, before cells write to them concurrently
    storage_for(settings.storage)
    tracking.experiment_id(tracking.client_for(settings.tracking_uri), grid_name=grid_name,
                           artifact_root=f"{settings.run_dir}/mlartifacts")
    settings_dict = settings.to_dict()
    failures = []
    with (
        keep_running_without_console(logger.warning),  # its Prefect worker may die first
        open_cluster(cluster, n_workers=max(networks), key=pool_key,
                     local_directory=os.path.join(settings.run_dir, "dask")),
        ThreadPoolTaskRunner(max_workers=max_concurrent_cells) as runner,
    ):
        futures = [
            (cell, runner.submit(run_cell, {
                "settings": settings_dict, "cell_key": cell.key,
                "cell": {"network": cell.network, "algorithm": cell.algorithm,
                         "model": cell.model},
                "pool_key": pool_key, "max_concurrent_trials": max_concurrent_trials,
            }))
            for cell in cells
        ]
        for cell, future in futures:
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 - reported after the others finish
                failures.append(f"{cell.key}: {exc}")
                logger.error("cell %s failed: %s", cell.key, exc)

    tracking.wait_plots()
    keys = {c.key for c in cells}
    rows = [r for r in grid_rows(settings.storage, grid_name=grid_name)
            if f"n{r['network']}/{r['algorithm']}/{r['model']}" in keys]
    csv_path, md_path = write_summary(rows, settings.run_dir)
    try:
        tracking.with_retries(lambda: _log_grid_summary(settings, rows, csv_path, md_path),
                              what="logging the grid's summary")
    except tracking.TrackingUnavailable as exc:  # the summary files are kept in the run dir
        logger.warning("%s", exc)
    with open(md_path) as f:
        create_markdown_artifact(markdown=f"# Grid `{grid_name}`\n\n" + f.read(),
                                 key=f"summary-{grid_name}".lower().replace("_", "-"))
    if failures:
        raise RuntimeError(f"{len(failures)} cell(s) failed: " + "; ".join(failures))
    running = sum(r["n_running"] for r in rows)
    if running:
        logger.warning("%d trial(s) were interrupted (%s); they are checkpointed and a rerun "
                       "of this grid continues them", running, interrupt.requested() or
                       "cluster lifetime or lost cluster")
    return rows


def _log_grid_summary(settings: GridSettings, rows: list[dict[str, Any]], csv_path: str,
                      md_path: str) -> None:
    """The summary as a table artifact on the grid's run in MLflow (plus CSV and Markdown)."""
    client = tracking.client_for(settings.tracking_uri)
    exp_id = tracking.experiment_id(client, grid_name=settings.grid_name,
                                    artifact_root=f"{settings.run_dir}/mlartifacts")
    runs = client.search_runs([exp_id], filter_string="tags.`damptune.kind` = 'grid'",
                              max_results=1)
    run_id = runs[0].info.run_id if runs else client.create_run(
        exp_id, run_name=f"{settings.grid_name} summary",
        tags={"damptune.kind": "grid"}).info.run_id
    table = {c: [str(r[c]) if isinstance(r[c], dict) else r[c] for r in rows]
             for c in ("network", "algorithm", "model", "best_value", "best_params",
                       "n_complete", "n_pruned", "n_failed")}
    client.log_table(run_id, data=table, artifact_file="summary.json")
    client.log_artifact(run_id, csv_path)
    client.log_artifact(run_id, md_path)
    client.set_terminated(run_id, status="FINISHED")
