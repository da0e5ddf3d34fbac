"""Which errors of a trial are faults of the infrastructure (retry it) and which are its own.

A *configuration error* (:class:`damptune.ConfigError`, a bad checkpoint, a bug: anything
deterministic) fails the trial: running it again gives the same error. A *fault* of the
cluster (a lost or replaced worker, a cluster that shrank below the trial's size, a rank that
did not answer in time, a closed connection) interrupts it: its checkpoint, Optuna trial and
MLflow run are kept, and the same run retries it on live workers.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import CancelledError

from damptune import ClusterError, DamptuneError
from tasks.results import TrialResult

__all__ = ["is_infrastructure_fault", "Retries", "TrialsInterrupted"]

log = logging.getLogger("damptune.tasks")

# errors Dask raises when a worker or the scheduler went away (matched by name: their
# modules move between releases)
_DASK_FAULTS = {"CommClosedError", "KilledWorker", "FutureCancelledError", "StreamClosedError"}
_NOT_FAULTS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
               NotADirectoryError)
_FAULTS = (ClusterError, TimeoutError, ConnectionError, OSError, EOFError, CancelledError)
# the KeyError Dask's scheduler raises when a worker it was asked about has just left (its
# scatter with broadcast=True looks each worker up: a worker that dies in between)
_WORKER_ADDRESS = re.compile(r"^(tcp|tls|ucx|inproc)://\S+$")


def is_infrastructure_fault(exc: BaseException) -> bool:
    """True when ``exc`` (or an error that caused it) is a fault of the cluster, not of the
    trial; a damptune error other than ClusterError (a ConfigError, a CheckpointError) never
    is."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _NOT_FAULTS) or (
                isinstance(current, DamptuneError) and not isinstance(current, ClusterError)):
            return False
        if isinstance(current, _FAULTS) or type(current).__name__ in _DASK_FAULTS:
            return True
        if isinstance(current, KeyError) and _names_a_worker(current):
            return True
        if "Worker holding Actor was lost" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _names_a_worker(exc: KeyError) -> bool:
    """A KeyError whose key is a Dask worker's address (a lookup of a worker that left)."""
    return len(exc.args) == 1 and bool(_WORKER_ADDRESS.match(str(exc.args[0])))


class TrialsInterrupted(ClusterError):
    """A cell stopped because faults of the cluster outlasted a trial's attempts. Nothing is
    lost: the trial's checkpoint, Optuna trial (RUNNING) and MLflow run are kept."""


class Retries:
    """The attempts of a cell's trials that faults of the cluster interrupt: each trial is
    tried ``attempts`` times in one run, waiting ``backoff`` s before the first retry and
    twice as long before each next one (60 s at most)."""

    def __init__(self, cell_key: str, *, attempts: int, backoff: float) -> None:
        self.cell_key, self.attempts, self.backoff = cell_key, attempts, backoff
        self.faults: dict[int, int] = {}

    def back_off(self, results: list[TrialResult]) -> bool:
        """Count these trials' faults; wait before retrying them. False when one of them has
        no attempt left."""
        for r in results:
            self.faults[r.number] = self.faults.get(r.number, 0) + 1
        worst = max(self.faults[r.number] for r in results)
        if worst >= self.attempts:
            return False
        wait = min(60.0, self.backoff * 2 ** (worst - 1))
        log.warning("%s: trial(s) %s interrupted by a fault of the cluster (attempt %d of %d); "
                    "retrying from the checkpoint in %.3g s", self.cell_key,
                    [r.number for r in results], worst, self.attempts, wait)
        time.sleep(wait)
        return True

    def error(self, results: list[TrialResult]) -> TrialsInterrupted:
        """The cell's error once attempts are used up."""
        r = max(results, key=lambda r: self.faults[r.number])
        return TrialsInterrupted(
            f"{self.cell_key}: trial {r.number} was interrupted by faults of the cluster in all "
            f"{self.attempts} attempts (last: {r.reason}). Nothing was lost: its checkpoint, its "
            f"Optuna trial (RUNNING, number {r.number}) and its MLflow run are kept, and a rerun "
            "of the grid continues it.")
