"""All MLflow code of one trial: its run (nested under its cell's), its dataset input, metrics,
system metrics, tags and plots."""

from __future__ import annotations

import logging
from typing import Any

from mlflow.entities import DatasetInput
from mlflow.exceptions import MlflowException
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
from mlflow.tracking import MlflowClient

from damptune import EvalRecord, Record, TrainState, UpdateRecord
from damptune.overhead import overhead_of
from tasks import tracking
from tasks.results import TrialResult, TrialState

__all__ = ["MlflowTrialLogger", "UPDATE_METRICS", "EVALS_PER_EPOCH"]

# its start and stop are logged at INFO, twice per trial
logging.getLogger("mlflow.system_metrics.system_metrics_monitor").setLevel(logging.WARNING)
# evaluations logged to MLflow per epoch, at most (and the last: the one at the target)
EVALS_PER_EPOCH = 8
UPDATE_METRICS = ("loss", "batch_size", "lr", "damping", "n_workers", "examples_seen",
                  "time_elapsed", "time_sim", "time_compute", "time_comm", "time_damper")


class MlflowTrialLogger:
    """Logs a trial to its MLflow run: update metrics every ``metrics_every`` updates and at
    every change of batch size or ranks, evaluation metrics (at most ``evals_per_epoch`` per
    epoch, and always the trial's last, the one that reached the target: the engine's dense
    evaluations near the target resolve the objective, not the chart, and the checkpoint's
    history keeps them all), sent every few seconds; the work each resumed attempt redoes,
    final metrics, the state tag and, given a ``plots`` queue, the plots (a search trial's; a
    held-out seed's run has its metrics only, which MLflow charts).

    The run is created once and found again on a rerun (same trial number → same run). With
    ``system_metrics``, MLflow's system metrics (``system/…``: CPU, memory, disk, network,
    GPU where there is one, of the machine that runs the trial's task) are logged while the
    run is open, every ``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` seconds (MLflow's
    default: 10).
    """

    def __init__(self, client: MlflowClient, plots: tracking.PlotQueue | None, *,
                 metrics_every: int, target: float, system_metrics: bool = False,
                 evals_per_epoch: float = EVALS_PER_EPOCH) -> None:
        self.client, self.plots = client, plots
        self.metrics_every, self.target = metrics_every, target
        self.eval_spacing = 1.0 / evals_per_epoch  # epochs between logged evaluations
        self.next_eval_epoch = 0.0
        self.held: EvalRecord | None = None  # an evaluation not logged yet (the last one?)
        self.run_id = ""
        self.metrics: tracking.MetricBuffer | None = None
        self.system_metrics = system_metrics
        self.monitor: SystemMetricsMonitor | None = None
        self.last: dict[str, Any] = {"batch_size": None, "n_workers": None}

    def open(self, experiment_id: str, *, parent_run_id: str, cell_key: str, number: int,
             params: dict[str, Any], seeded_from: str = "",
             dataset: DatasetInput | None = None) -> str:
        """Create (or find again) the trial's run and mark it RUNNING (tagged
        ``damptune.seeded_from`` when a warm start enqueued it), with ``dataset`` as its
        input; start its system metrics; returns its id."""
        tags = {"damptune.seeded_from": seeded_from} if seeded_from else {}
        self.run_id, existed = tracking.with_retries(lambda: tracking.child_run(
            self.client, experiment_id, parent_id=parent_run_id, cell_key=cell_key,
            number=number, params=params, tags=tags), what="creating the trial's run")
        if existed:  # a resumed trial continues its run (a new one is created RUNNING)
            if tags:
                tracking.with_retries(lambda: tracking.set_tags(self.client, self.run_id, tags),
                                      what="tagging the trial's run")
            tracking.with_retries(lambda: self.client.update_run(self.run_id, status="RUNNING"),
                                  what="reopening the run")
        if dataset is not None:  # MLflow keeps one input per dataset and run: a rerun adds none
            tracking.with_retries(lambda: self.client.log_inputs(self.run_id, [dataset]),
                                  what="logging the trial's dataset")
        self.metrics = tracking.MetricBuffer(self.client, self.run_id)
        if self.system_metrics:  # a resumed run continues its steps
            self.monitor = SystemMetricsMonitor(self.run_id, resume_logging=True,
                                                tracking_uri=str(self.client.tracking_uri))
            self.monitor.start()
        return self.run_id

    def __call__(self, record: Record) -> None:
        assert self.metrics is not None, "open() the run first"
        if isinstance(record, UpdateRecord):
            values = record.as_dict()
            changed = any(values[k] != v for k, v in self.last.items())
            if changed or record.update % self.metrics_every == 0:
                self.metrics.add({k: values[k] for k in UPDATE_METRICS}, step=record.update)
                self.last.update({k: values[k] for k in self.last})
        elif isinstance(record, EvalRecord):
            if record.epoch >= self.next_eval_epoch:
                self._log_eval(record)
            else:  # logged at the end if it turns out to be the last
                self.held = record

    def _log_eval(self, record: EvalRecord) -> None:
        assert self.metrics is not None, "open() the run first"
        self.metrics.add({"test_accuracy": record.test_accuracy, "test_loss": record.test_loss,
                          "eval_time_sim": record.time_sim}, step=record.update)
        self.next_eval_epoch = record.epoch + self.eval_spacing
        self.held = None

    def _log_held(self) -> None:
        if self.held is not None:  # the trial's last evaluation
            self._log_eval(self.held)

    def log_resumed_attempt(self, started: dict[str, Any]) -> None:
        """What a resumed attempt redoes: the work its dead predecessor lost."""
        assert self.metrics is not None, "open() the run first"
        self.metrics.add({"attempt": started["attempt"], "lost_updates": started["lost_updates"],
                          "lost_seconds": started["lost_seconds"]}, step=started["resumed_at"])

    def finish(self, result: TrialResult, state: TrainState, work: dict[str, Any]) -> None:
        """Final metrics, the state tag, FINISHED, and for a COMPLETE trial the plots (drawn in
        the background) when the logger has a queue for them."""
        assert self.metrics is not None, "open() the run first"
        self.metrics.add({
            "objective": result.value, "reached_target": float(result.reached),
            "best_accuracy": result.best_accuracy, "updates": state.update,
            "examples_seen_total": state.examples_seen, "time_sim_total": state.time_sim,
            "time_elapsed_total": state.time_elapsed, "attempts": work["attempts"],
            "lost_updates_total": work["lost_updates"],
            "lost_seconds_total": work["lost_seconds"], **_measured_overhead(state)},
            step=state.update)
        self._log_held()
        self.metrics.flush(tags={"damptune.state": result.state.value})  # one request
        self.end("FINISHED")
        if self.plots is not None and result.state is TrialState.COMPLETE:  # pruned: no plots
            self.plots.submit(self.client, self.run_id, state.history, target=self.target)

    def finish_reused(self, result: TrialResult, *, source_run: str) -> None:
        """A reused training's run (:mod:`tasks.reuse`): the result's objective, and the final
        metrics of the run it repeats (their latest values, system metrics aside; none if that
        run was deleted), the state tag and ``damptune.reused_from`` (that run's id), FINISHED;
        its plots, copied, when the logger has a queue for them."""
        assert self.metrics is not None, "open() the run first"
        metrics = {"objective": result.value, "reached_target": float(result.reached),
                   "best_accuracy": result.best_accuracy}
        try:
            metrics.update(tracking.with_retries(
                lambda: self.client.get_run(source_run).data.metrics,
                what="reading the reused training's run"))
        except MlflowException as exc:  # deleted: its outcome is in Optuna, and above
            if exc.get_http_status_code() != 404:
                raise
        self.metrics.add({k: v for k, v in metrics.items() if not k.startswith("system/")},
                         step=int(metrics.get("updates") or 0))
        self.metrics.flush(tags={"damptune.state": result.state.value,
                                 "damptune.reused_from": source_run})
        self.end("FINISHED")
        if self.plots is not None:
            self.plots.copy(self.client, self.run_id, source_run)

    def end(self, status: str) -> None:
        """Flush what is buffered and end the run with ``status`` (KILLED, FAILED, FINISHED)."""
        self.stop_system_metrics()
        if self.metrics is not None:
            self._log_held()
            self.metrics.flush()
        tracking.with_retries(lambda: self.client.set_terminated(self.run_id, status=status),
                              what=f"ending the trial's run ({status})")


    def stop_system_metrics(self, *, wait: bool = True) -> None:
        """Stop the run's system metrics (waiting to send the last ones); idempotent. Without
        ``wait`` (MLflow may not answer) only tell the monitor's thread to stop."""
        monitor, self.monitor = self.monitor, None
        if monitor is None:
            return
        if wait:
            monitor.finish()
        else:  # MLflow's monitor has no public stop that does not wait for its last request
            monitor._shutdown_event.set()


def _measured_overhead(state: TrainState) -> dict[str, float | None]:
    """The engine's measured orchestration overhead per update on this cluster (fixed and per
    rank, ms: :mod:`damptune.overhead`), fitted from the trial's own updates."""
    fit = overhead_of(state.history)
    if fit is None:
        return {}
    return {"measured_overhead_ms": fit.fixed * 1e3,
            "measured_overhead_per_rank_ms": fit.per_rank * 1e3}
