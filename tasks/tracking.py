"""MLflow side: one experiment per grid, a parent run per cell, a child run per trial.

All calls go through an explicit ``MlflowClient(tracking_uri)``: no global MLflow state, safe
from the threads that run cells and trials.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tasks.grid import Cell, GridSettings
from tasks.mlflow_store import open_sqlite_store
from tasks.retries import retry
from tasks.sqlite import sqlite_file
from tasks.stores import StoreFault

__all__ = [
    "client_for",
    "experiment_id",
    "parent_run",
    "child_run",
    "find_cell_run",
    "find_trial_run",
    "MetricBuffer",
    "redact",
    "with_retries",
    "TrackingUnavailable",
    "log_plots",
    "PlotQueue",
    "set_tags",
    "trial_run_ids",
    "tag_cell_run",
    "log_grid_summary",
    "log_report",
    "artifact_url",
    "open_cell_run",
    "check_reachable",
]

T = TypeVar("T")
CELL_TAG, TRIAL_TAG, GRID_TAG = "damptune.cell", "damptune.trial_number", "damptune.grid"
STAGE_TAG = "damptune.stage"  # search, selection, validation or matched (tasks.validation)
_SECRET = re.compile(r"(://[^:/@\s]+:)([^@\s]+)(@)")


def redact(text: str) -> str:
    """Hide the password of a URL (``postgresql://user:secret@host`` → ``user:***@``)."""
    return _SECRET.sub(r"\1***\3", str(text))


class TrackingUnavailable(StoreFault):
    """The MLflow tracking store stayed unreachable through the retries (a fault of the
    server, not of the input)."""


def with_retries(fn: Callable[[], T], *, what: str, attempts: int = 4, delay: float = 0.5) -> T:
    """Retry a tracking call on transient errors (server restarting, SQLite busy); then raise
    :class:`TrackingUnavailable`. Bad input (an unknown run, an invalid value) is not retried.

    Each attempt is itself an MLflow HTTP request with MLflow's own retries, which
    :func:`client_for` bounds (``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` 3, backoff factor 1,
    timeout 30 s, unless set): an unreachable server gives up after about 35 s.
    """
    permanent = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER")
    # a REST store's message names the code; a local (SQLite) store's has it only as error_code
    return retry(fn, transient=lambda exc: isinstance(exc, MlflowException | OSError)
                 and not any(code in str(exc) or code == getattr(exc, "error_code", None)
                             for code in permanent),
                 give_up=lambda exc: TrackingUnavailable(
                     f"MLflow did not answer after {attempts} attempts while {what}: "
                     f"{redact(str(exc))[:500]}. Nothing was lost: the trial keeps its "
                     "checkpoint and its run; rerun the grid when MLflow is back."),
                 attempts=attempts, delay=delay)


# one client per URI and process: building one over SQLite checks the schema (~1 s), and the
# cells' and trials' threads of every session share it (MlflowClient is thread-safe)
_CLIENTS: dict[str, MlflowClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(tracking_uri: str) -> MlflowClient:
    """One client per tracking URI in this process (shared by its threads): building one
    over SQLite checks the schema, ~1 s each time (a new SQLite store is first copied from an
    empty one, :mod:`tasks.mlflow_store`)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow's own retries of one request (default 7 with backoff factor 2: minutes); bounded
    # here so that an outage ends in a clear error (with_retries) within about half a minute
    for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3"),
                        ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                        ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")):
        os.environ.setdefault(name, value)
    with _CLIENTS_LOCK:
        if tracking_uri not in _CLIENTS:
            open_sqlite_store(tracking_uri)  # a new one a copy, not 3 s of schema; WAL mode
            _CLIENTS[tracking_uri] = MlflowClient(tracking_uri=tracking_uri)
        return _CLIENTS[tracking_uri]


def check_reachable(tracking_uri: str) -> None:
    """At the grid's start, before anything is written: a tracking store that is not a local
    file (an MLflow server, a database) answers one request, with MLflow's own bounded retries
    (:func:`client_for`), else :class:`TrackingUnavailable` naming the URI and the cause. One
    attempt, not :func:`with_retries`' four: nothing is under way that a wait would save."""
    scheme = urlsplit(str(tracking_uri)).scheme
    if sqlite_file(tracking_uri) is not None or scheme in ("", "file"):
        return
    try:
        client_for(tracking_uri).search_experiments(max_results=1)
    except (MlflowException, OSError) as exc:
        raise TrackingUnavailable(
            f"MLflow at tracking_uri={redact(tracking_uri)!r} did not answer at the grid's start "
            f"({_cause(exc)}): a fault of the server, not of the input. Nothing was run: no "
            "trial was asked and nothing was written. Start MLflow there (or give the grid "
            "the tracking_uri of one that runs) and run the grid again.") from None


def _cause(exc: Exception) -> str:
    """The words of a failed request's cause (``[Errno 111] Connection refused``), else the
    first line of its message."""
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
    return found.group(0) if found else redact(str(exc)).splitlines()[0][:300]


# MLflow 3's UI opens an experiment without this tag on its GenAI view (traces); with it, on
# the training runs
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"


def experiment_id(client: MlflowClient, *, grid_name: str, artifact_root: str) -> str:
    """The grid's experiment, created with an explicit artifact location and tagged as model
    training (an experiment of an older version gets the tag when found)."""
    name = f"damptune-{grid_name}"
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, KIND_TAG, KIND)
        return str(exp.experiment_id)
    uri = str(client.tracking_uri)
    if uri.startswith(("http://", "https://")):
        location = f"mlflow-artifacts:/{name}"  # served by the tracking server
    else:
        location = os.path.abspath(os.path.join(artifact_root, name))
    try:
        return str(client.create_experiment(name, artifact_location=location,
                                            tags={GRID_TAG: grid_name, KIND_TAG: KIND}))
    except MlflowException:  # created meanwhile by another cell
        exp = client.get_experiment_by_name(name)
        assert exp is not None
        return str(exp.experiment_id)


def _find(client: MlflowClient, exp_id: str, filter_string: str) -> str | None:
    runs = client.search_runs([exp_id], filter_string=filter_string, max_results=2,
                              order_by=["attributes.start_time ASC"])
    return runs[0].info.run_id if runs else None


def find_cell_run(client: MlflowClient, exp_id: str, *, cell_key: str) -> str | None:
    """The cell's parent run, or None before it is created."""
    return _find(client, exp_id, f"tags.`{CELL_TAG}` = '{cell_key}' and "
                                 f"tags.`damptune.kind` = 'cell'")


def parent_run(client: MlflowClient, exp_id: str, *, cell_key: str, params: dict[str, Any]) -> str:
    """The cell's parent run: created once, found again on a rerun."""
    found = find_cell_run(client, exp_id, cell_key=cell_key)
    if found:
        return found
    run = client.create_run(exp_id, run_name=cell_key,
                            tags={CELL_TAG: cell_key, "damptune.kind": "cell",
                                  STAGE_TAG: stage_of(cell_key)})
    client.log_batch(run.info.run_id, params=[Param(k, redact(str(v))[:6000])
                                              for k, v in params.items()])
    return run.info.run_id


def stage_of(cell_key: str) -> str:
    """``selection``, ``validation`` or ``matched`` for such a cell's key
    (``n4/geodamp/mlp/validation``), else ``search`` (a replica's ``n2/sgd/mlp/r1`` too): the
    runs' tag ``damptune.stage``."""
    last = cell_key.rsplit("/", 1)[-1]
    return last if last in ("selection", "validation", "matched") else "search"


def find_trial_run(client: MlflowClient, exp_id: str, *, cell_key: str, number: int) -> str | None:
    return _find(client, exp_id, f"tags.`{CELL_TAG}` = '{cell_key}' and "
                                 f"tags.`{TRIAL_TAG}` = '{number}'")


def child_run(
    client: MlflowClient, exp_id: str, *, parent_id: str, cell_key: str, number: int,
    params: dict[str, Any], tags: dict[str, str] | None = None,
) -> tuple[str, bool]:
    """The trial's run, nested under the cell's (``mlflow.parentRunId``), created RUNNING with
    ``tags`` besides its own; reused on rerun. (Its id, whether it existed: then it is left as
    it was, tags and status included.)"""
    found = find_trial_run(client, exp_id, cell_key=cell_key, number=number)
    if found:
        return found, True
    run = client.create_run(exp_id, run_name=f"{cell_key}/trial-{number}", tags={
        **(tags or {}), "mlflow.parentRunId": parent_id, CELL_TAG: cell_key,
        TRIAL_TAG: str(number), "damptune.kind": "trial", STAGE_TAG: stage_of(cell_key),
    })
    client.log_batch(run.info.run_id, params=[Param(k, redact(str(v))[:6000])
                                              for k, v in params.items()])
    return run.info.run_id, False


class MetricBuffer:
    """Collects step metrics and sends them in batches (MLflow takes 1000 per call): when
    ``size`` are waiting, or ``interval`` seconds after the last batch, so the UI follows a
    running trial without a request per evaluation."""

    def __init__(self, client: MlflowClient, run_id: str, *, size: int = 900,
                 interval: float = 5.0) -> None:
        self.client, self.run_id, self.size, self.interval = client, run_id, size, interval
        self.metrics: list[Metric] = []
        self.sent_at = time.monotonic()

    def add(self, values: dict[str, float | None], *, step: int) -> None:
        now = int(time.time() * 1000)
        self.metrics.extend(Metric(k, float(v), now, step) for k, v in values.items()
                            if v is not None)
        if len(self.metrics) >= self.size or time.monotonic() - self.sent_at >= self.interval:
            self.flush()

    def flush(self, tags: dict[str, Any] | None = None) -> None:
        """Send what is waiting; ``tags`` travel with the last batch (alone if none waits)."""
        self.sent_at = time.monotonic()
        run_tags = [RunTag(k, redact(str(v))) for k, v in (tags or {}).items()]
        while self.metrics or run_tags:
            chunk, self.metrics = self.metrics[:1000], self.metrics[1000:]
            self._send(chunk, [] if self.metrics else run_tags)
            if not self.metrics:
                run_tags = []

    def _send(self, chunk: list[Metric], tags: list[RunTag]) -> None:
        with_retries(lambda: self.client.log_batch(self.run_id, metrics=chunk, tags=tags),
                     what="logging metrics")


def set_tags(client: MlflowClient, run_id: str, tags: dict[str, Any]) -> None:
    client.log_batch(run_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])


class PlotQueue:
    """Draws and uploads trials' plots on one background thread; a cell waits for its own.

    Owned by the flow run's session (:mod:`tasks.session`), so two flow runs in one process
    do not wait for each other's plots.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="damptune-plots")
        self._pending: dict[str, Future[None]] = {}

    def submit(self, client: MlflowClient, run_id: str, history: list[dict[str, Any]], *,
               target: float) -> None:
        """Draw and upload the plots of ``run_id`` in the background."""
        self._pending[run_id] = self._pool.submit(log_plots, client, run_id, list(history),
                                                  target=target)

    def copy(self, client: MlflowClient, run_id: str, source_run: str) -> None:
        """Copy the plots of ``source_run`` to ``run_id`` in the background (after any of its
        own still queued: one thread, in order)."""
        self._pending[run_id] = self._pool.submit(copy_plots, client, run_id, source_run)

    def wait(self, run_ids: list[str] | None = None, *, timeout: float = 300.0) -> None:
        """Wait for the plots of these runs (all if None); a failed upload is logged only."""
        for run_id in list(self._pending) if run_ids is None else run_ids:
            future = self._pending.pop(run_id, None)
            if future is None:
                continue
            try:
                future.result(timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - plots are a convenience, results are kept
                logging.getLogger("damptune.tasks").warning("plots of run %s: %s", run_id, exc)

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)


def log_plots(client: MlflowClient, run_id: str, history: list[dict[str, Any]], *,
              target: float) -> None:
    """Batch size and lr per update; test accuracy against simulated (and measured) time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    updates = [r for r in history if r["kind"] == "update"]
    evals = [r for r in history if r["kind"] == "eval"]
    with tempfile.TemporaryDirectory() as tmp:
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=80)
        ax.plot([r["update"] for r in updates], [r["batch_size"] for r in updates],
                color="tab:blue")
        ax.set_xlabel("model update")
        ax.set_ylabel("batch size (examples)", color="tab:blue")
        ax2 = ax.twinx()
        ax2.plot([r["update"] for r in updates], [r["lr"] for r in updates], color="tab:red")
        ax2.set_ylabel("learning rate", color="tab:red")
        ax.set_title("damping schedule")
        fig.savefig(os.path.join(tmp, "schedule.png"))
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=80)
        ax.plot([r["time_sim"] for r in evals], [r["test_accuracy"] for r in evals], marker="o",
                label="simulated")
        ax.plot([r["time_elapsed"] for r in evals], [r["test_accuracy"] for r in evals],
                marker=".", linestyle=":", label="measured here")
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
        ax.set_xlabel("wall-clock (s)")
        ax.set_ylabel("test accuracy")
        ax.legend()
        ax.set_title("accuracy vs time")
        fig.savefig(os.path.join(tmp, "accuracy_vs_time.png"))
        plt.close(fig)
        with_retries(lambda: client.log_artifacts(run_id, tmp, artifact_path="plots"),
                     what="logging plots")


def copy_plots(client: MlflowClient, run_id: str, source_run: str) -> None:
    """The plots of ``source_run`` (if it has any) logged to ``run_id`` too."""
    if not with_retries(lambda: client.list_artifacts(source_run, "plots"),
                        what="listing plots"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        local = with_retries(lambda: client.download_artifacts(source_run, "plots", tmp),
                             what="reading plots")
        with_retries(lambda: client.log_artifacts(run_id, local, artifact_path="plots"),
                     what="logging plots")


def trial_run_ids(client: MlflowClient, exp_id: str, *, cell_key: str) -> list[str]:
    """The runs of a cell's trials."""
    return [r.info.run_id for r in client.search_runs(
        [exp_id], f"tags.`{CELL_TAG}` = '{cell_key}' and tags.`damptune.kind` = 'trial'",
        max_results=1000)]


def tag_cell_run(client: MlflowClient, exp_id: str, parent: str, *, cell_key: str,
                 summary: dict[str, Any], interrupted: bool) -> None:
    """Tag the cell's run with its counts and best trial, log ``best_value``, and end it
    (KILLED if the cell was interrupted)."""
    tags: dict[str, Any] = {"damptune.n_complete": summary["n_complete"],
                            "damptune.n_pruned": summary["n_pruned"],
                            "damptune.n_failed": summary["n_failed"]}
    if summary["best_trial"] is not None:
        best_run = find_trial_run(client, exp_id, cell_key=cell_key,
                                  number=summary["best_trial"])
        tags.update({"damptune.best_trial": summary["best_trial"],
                     "damptune.best_value": summary["best_value"],
                     "damptune.best_run_id": best_run or "",
                     "damptune.best_params": summary["best_params"]})
        client.log_metric(parent, "best_value", float(summary["best_value"]))
    set_tags(client, parent, tags)
    client.set_terminated(parent, status="KILLED" if interrupted else "FINISHED")


SUMMARY_COLUMNS = ("network", "algorithm", "model", "best_value", "reached", "best_params",
                   "n_complete", "n_pruned", "n_failed")


def log_grid_summary(client: MlflowClient, exp_id: str, *, grid_name: str,
                     rows: list[dict[str, Any]], files: tuple[str, ...]) -> str:
    """The grid's summary as a table artifact (and ``files``) on the grid's run
    ``<grid> summary`` (created once); returns that run's id."""
    runs = client.search_runs([exp_id], filter_string="tags.`damptune.kind` = 'grid'",
                              max_results=1)
    run_id = runs[0].info.run_id if runs else client.create_run(
        exp_id, run_name=f"{grid_name} summary", tags={"damptune.kind": "grid"}).info.run_id
    table = {c: [str(r[c]) if isinstance(r[c], dict) else r[c] for r in rows]
             for c in SUMMARY_COLUMNS}
    client.log_table(run_id, data=table, artifact_file="summary.json")
    for path in files:
        client.log_artifact(run_id, path)
    client.set_terminated(run_id, status="FINISHED")
    return str(run_id)


def log_report(client: MlflowClient, run_id: str, report_dir: str) -> None:
    """The files of the grid's report directory, as artifacts under ``report/`` of its run."""
    client.log_artifacts(run_id, report_dir, artifact_path="report")


def artifact_url(tracking_uri: str, run_id: str, path: str) -> str | None:
    """Where an MLflow tracking server serves one of a run's artifacts (its Flask route
    ``/get-artifact?path=…&run_uuid=…``), without the URI's credentials; None when the
    tracking URI is not an http(s) server (a local store serves nothing)."""
    parts = urlsplit(str(tracking_uri))
    if parts.scheme not in ("http", "https"):
        return None
    netloc = parts.netloc.rsplit("@", 1)[-1]  # user:password@ never goes into a link
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return f"{base}/get-artifact?" + urlencode({"path": path, "run_uuid": run_id})


def open_cell_run(client: MlflowClient, grid: GridSettings, cell: Cell,
                  study: str) -> tuple[str, str]:
    """The grid's experiment and the cell's parent run (created once, reopened RUNNING on a
    rerun): ``(experiment id, run id)``."""
    exp_id = experiment_id(client, grid_name=grid.grid_name,
                           artifact_root=f"{grid.run_dir}/mlartifacts")
    parent = parent_run(client, exp_id, cell_key=cell.key, params={
        "network": cell.network, "algorithm": cell.algorithm, "model": cell.model,
        "dataset": grid.dataset, "data_seed": grid.data_seed,
        "target_accuracy": grid.target_of(cell), "profile": grid.profile,
        "mode": grid.mode, "trials": grid.trials_for(cell.model),
        "epochs": grid.epochs_for(cell.model), "seed": grid.seed, "sampler": grid.sampler,
        "pruner": grid.pruner, "study": study,
    })
    client.update_run(parent, status="RUNNING")
    return exp_id, parent
