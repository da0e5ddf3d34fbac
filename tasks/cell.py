"""The cell task: one Optuna study whose trials run as Prefect tasks submitted from here.

Trials go to a thread pool owned by this cell (not to the flow's runner), so a cell waiting on
its trials never starves them of threads, whatever the number of cells and trials. The study's
ask, tell, leases and resume belong to :class:`~tasks.driver.StudyDriver`.
"""

from __future__ import annotations

import time
from typing import Any

import optuna
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from damptune import interrupt
from models import load_dataset
from tasks import tracking
from tasks.driver import StudyDriver, Ticket
from tasks.faults import Retries, is_infrastructure_fault
from tasks.grid import Cell, GridSettings, checkpoint_path
from tasks.logs import run_logger
from tasks.registry import log_best_of_cell, log_runner_up
from tasks.results import TrialResult, TrialState
from tasks.reuse import REUSED_ATTR
from tasks.search import (
    best_trial,
    distributions,
    open_study,
    storage_for,
    study_name,
    study_space,
    summarize,
    with_storage_retries,
)
from tasks.session import Session, session_for
from tasks.trial import run_trial
from tasks.validation import (
    runner_up_answer,
    seed_validation,
    validation_due,
    validation_total,
)
from tasks.warmstart import seed_study, seeds_of

__all__ = ["run_cell"]

State = optuna.trial.TrialState



# how often a cell that waits for another run's trials looks again: a trial of a live run
# may take a second, and the waiting run asks the next trial as soon as it ends
WAIT_POLL_SECONDS = 0.5


@task(name="cell", cache_policy=NO_CACHE, task_run_name="cell {cell_key}")
def run_cell(*, settings: dict[str, Any], cell_key: str, cell: dict[str, Any],
             session_key: str, max_concurrent_trials: int = 1,
             seed_cells: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run the cell's study until it holds ``trials`` finished trials in all.

    A new study is first seeded with the best configurations of ``seed_cells`` (its finished
    neighbours: :mod:`tasks.warmstart`). Trials left RUNNING by an interrupted or dead run are
    resumed first (same numbers); then new trials are asked in deterministic batches; while
    another live run trains the rest, the cell waits for it (or for its leases to expire, and
    takes them over). A held-out cell (selection, estimation, matched) trains what
    :func:`tasks.validation.seed_validation` enqueued, once its sources are finished.
    """
    grid, c = GridSettings(**settings), Cell(**cell)
    session = session_for(session_key)
    study = _open_study(grid, c, seed_cells or [], session)
    exp_id, parent = tracking.with_retries(lambda: tracking.open_cell_run(
        session.tracking, grid, c, study_name(grid, c)), what="opening the cell's run")
    total = grid.trials_for(c.model) if c.stage == "search" else validation_total(study)
    driver = StudyDriver(study, grid, leases=session.leases, owner=session.key,
                         space=study_space(study, distributions(grid, c)),
                         batch=max_concurrent_trials, total=total)
    submit = {"settings": settings, "cell_key": c.key, "cell": cell, "session_key": session.key,
              "experiment_id": exp_id, "parent_run_id": parent}
    retries = Retries(c.key, attempts=grid.trial_attempts, backoff=grid.retry_backoff)
    if c.stage != "search" and not validation_due(study):  # its search has no best yet
        return _finish(session, study, grid, c, exp_id, parent, interrupted=False)
    runner: ThreadPoolTaskRunner[Any]
    with ThreadPoolTaskRunner(max_workers=max_concurrent_trials) as runner:
        outcome = _train_due(runner, driver, submit, retries, session)
    if outcome is not None:  # interrupted, or a fault past its attempts
        summary = _finish(session, study, grid, c, exp_id, parent, interrupted=True)
        if isinstance(outcome, Exception):
            raise outcome
        return summary
    return _finish(session, study, grid, c, exp_id, parent, interrupted=False)


def _train_due(runner: ThreadPoolTaskRunner[Any], driver: StudyDriver, submit: dict[str, Any],
               retries: Retries, session: Session) -> Exception | bool | None:
    """Train the study's due trials, in batches, until it holds all its trials finished (by
    this run or another live one, waited for). None then; True when interrupted; the error
    when a cluster fault outlived its attempts."""
    while True:
        batch = driver.stale_trials() or driver.next_batch()
        if batch is None:  # no new trial is due: done once all are finished, by any run
            if driver.all_finished():
                return None
            if interrupt.requested():
                return True
            if driver.held_elsewhere():  # else one is free now: resume it at once
                time.sleep(min(WAIT_POLL_SECONDS, session.leases.ttl / 4))
            continue
        results = _run_batch(runner, driver, batch, submit)
        if any(r.state is TrialState.INTERRUPTED and r.fault is None for r in results):
            return True
        faults = [r for r in results if r.fault is not None]
        if faults and not retries.back_off(faults):  # attempts used up: stop the cell
            return retries.error(faults)


def _open_study(grid: GridSettings, c: Cell, seed_cells: list[dict[str, Any]],
                session: Session) -> optuna.Study:
    """The cell's study, seeded by its finished neighbours when it is new (warm start); a
    held-out cell's, with what it retrains once per held-out seed."""
    n_train = len(load_dataset(grid.dataset, seed=grid.data_seed,
                               root=grid.data_root or None).y_train)
    study = with_storage_retries(lambda: open_study(grid, c, n_train=n_train))
    if c.stage != "search":  # selection, validation, matched
        with_storage_retries(lambda: seed_validation(study, grid, leases=session.leases,
                                                     owner=session.key))
    elif grid.warm_start and seed_cells:
        with_storage_retries(lambda: _warm_start(grid, c, study, seed_cells))
    return study


def _warm_start(grid: GridSettings, c: Cell, study: optuna.Study,
                seed_cells: list[dict[str, Any]]) -> None:
    """Enqueue the best configurations of the cell's finished neighbours (once)."""
    sources = []
    for d in seed_cells:
        neighbour = Cell(**d)
        try:
            sources.append((neighbour, optuna.load_study(
                study_name=study_name(grid, neighbour), storage=storage_for(grid.storage))))
        except KeyError:  # not in this storage (a grid that never ran it)
            continue
    seeded = seed_study(study, seeds_of(sources, distributions(grid, c)))
    if seeded:
        run_logger().info("%s: seeded with %d configuration(s) of %s", c.key, seeded,
                          [s.key for s, _ in sources])


def _run_batch(runner: ThreadPoolTaskRunner[Any], driver: StudyDriver, batch: list[Ticket],
               submit: dict[str, Any]) -> list[TrialResult]:
    """Train a batch of trials at once and record each. An outage (a store that stayed
    unreachable) stops the cell with that store's error."""
    futures = [(t, runner.submit(run_trial, {
        **submit, "number": t.number, "trial_id": t.trial_id, "params": t.params,
        "lease_key": driver.lease_key(t.number), "seeded_from": t.seeded_from,
        "train_seed": t.train_seed}))
        for t in batch]
    results = [_result_of(ticket, future) for ticket, future in futures]
    for result in results:
        driver.record(result)
        _log(result, submit["cell_key"])
    outages = [r.outage for r in results if r.outage is not None]
    if outages:
        raise outages[0]
    return results


def _result_of(ticket: Ticket, future: Any) -> TrialResult:
    """The trial's result. An error it raised makes it FAIL (with the message), unless it is
    a fault of the cluster: then it is INTERRUPTED, to be retried."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - recorded as a failed or interrupted trial
        if is_infrastructure_fault(exc):
            return TrialResult(ticket.number, TrialState.INTERRUPTED, ticket.params,
                               reason=f"cluster fault: {exc}", fault=exc)
        return TrialResult(ticket.number, TrialState.FAIL, ticket.params,
                           reason=f"{type(exc).__name__}: {exc}")


def _log(result: TrialResult, cell_key: str) -> None:
    log = run_logger()
    if result.state is TrialState.FAIL:
        log.warning("trial %s of %s failed: %s", result.number, cell_key, result.reason)
    elif result.state is TrialState.INTERRUPTED:
        log.warning("trial %s of %s interrupted: %s", result.number, cell_key, result.reason)
    else:
        reused = f" (reused {result.user_attrs[REUSED_ATTR]})" if (
            REUSED_ATTR in result.user_attrs) else ""
        log.info("%s trial %s: %s value=%.4g params=%s%s", cell_key, result.number,
                 result.state.value, result.value, result.params, reused)


def _search_best(grid: GridSettings) -> int | None:
    """The number of the best trial of a held-out cell's search (replica 0)."""
    searched = optuna.load_study(study_name=study_name(grid, Cell(**grid.extra["source"])),
                                 storage=storage_for(grid.storage))
    best = best_trial(searched.get_trials(deepcopy=False))
    return best.number if best else None


def _finish(session: Session, study: optuna.Study, grid: GridSettings, c: Cell, exp_id: str,
            parent: str, *, interrupted: bool) -> dict[str, Any]:
    """Tag the parent run with the best trial and the counts; return the cell's summary."""

    def tag() -> dict[str, Any]:
        session.plots.wait(tracking.trial_run_ids(session.tracking, exp_id, cell_key=c.key))
        summary = summarize(study, c)
        best = summary["best_trial"]
        if c.stage == "search" and not interrupted and best is not None:  # as an MLflow model
            log_best_of_cell(session.tracking, grid, c, exp_id, parent, best_trial=best,
                             checkpoint=checkpoint_path(grid, c, best))
        runner_up = (runner_up_answer(study, search_best=_search_best(grid))
                     if c.stage == "validation" else None)
        if not interrupted and runner_up is not None:  # the search cell's model follows it
            log_runner_up(session.tracking, grid, c, Cell(**grid.extra["source"]), exp_id,
                          number=runner_up)
        tracking.tag_cell_run(session.tracking, exp_id, parent, cell_key=c.key,
                              summary=summary, interrupted=interrupted)
        return {**summary, "parent_run_id": parent, "interrupted": interrupted}

    return tracking.with_retries(tag, what="tagging the cell's run")
