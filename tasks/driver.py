"""The study driver: a cell's ask, tell, leases and resume — the only code that touches
Optuna's trial internals.

Trials are trained in deterministic batches: a batch is asked only when the previous one is
finished, each trial's sampler seeded by (grid seed, study, trial number), so a killed and
rerun grid asks the same hyperparameters for every trial number. A run trains a trial only
while it holds the trial's lease (:mod:`tasks.leases`): trials left RUNNING by a dead run are
taken over, under the same number, once their lease expires.

Optuna has no state for a trial that waits for a rerun: it stays RUNNING. Its user attribute
``damptune_state`` (:data:`DAMPTUNE_STATE`) says so where Optuna's dashboard shows it:
``interrupted`` once a run stops it with a checkpoint (or :func:`mark_stale` finds the run that
trained it dead), ``resumed`` once a rerun continues it (and after it finishes).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import time
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution

from tasks.grid import GridSettings
from tasks.leases import Leases, leases_for
from tasks.results import TrialResult, TrialState
from tasks.search import (
    FINISHED,
    TARGET_CONSTRAINT,
    StorageUnavailable,
    sampler_for,
    storage_for,
    with_storage_retries,
)
from tasks.validation import TRAIN_SEED
from tasks.warmstart import SEEDED_FROM

__all__ = ["DAMPTUNE_STATE", "INTERRUPTED", "RESUMED", "StudyDriver", "Ticket", "mark_stale",
           "trial_handle"]

State = optuna.trial.TrialState
DAMPTUNE_STATE = "damptune_state"  # user attribute of a trial a run stopped or continued
INTERRUPTED = "interrupted"  # RUNNING in Optuna, but nothing trains it: a rerun continues it
RESUMED = "resumed"  # a rerun continued it from its checkpoint (then it finished, or trains)


@dataclass(frozen=True)
class Ticket:
    """A trial this run holds the lease of and may train: its number, Optuna's id for it
    (what :func:`trial_handle` needs) and its hyperparameters."""

    number: int
    trial_id: int
    params: dict[str, Any]
    seeded_from: str = ""  # a warm-start trial: the cell and trial it came from
    train_seed: int | None = None  # a validation trial: its held-out training seed


def _ticket(t: optuna.trial.FrozenTrial) -> Ticket:
    seed = t.user_attrs.get(TRAIN_SEED)
    return Ticket(t.number, t._trial_id, dict(t.params), str(t.user_attrs.get(SEEDED_FROM, "")),
                  None if seed is None else int(seed))


def trial_handle(study: optuna.Study, trial_id: int) -> optuna.Trial:
    """The Optuna trial to report to, from a :class:`Ticket`'s ``trial_id``."""
    return optuna.trial.Trial(study, trial_id)


class StudyDriver:
    """One cell's study as seen by one run (``owner``) that trains ``batch`` trials at once."""

    def __init__(self, study: optuna.Study, settings: GridSettings, *, leases: Leases,
                 owner: str, space: dict[str, BaseDistribution], batch: int,
                 total: int) -> None:
        self.study, self.settings, self.leases = study, settings, leases
        self.owner, self.space, self.batch = owner, space, batch
        self.total = total  # the cell's trials, in all
        # trials an earlier run left RUNNING (killed, or interrupted): no new trial is asked
        # before they finish, so that every trial's pruning bound (the best of the trials
        # before it) is the clean run's; one whose dead run's lease has yet to expire is waited
        # for, then resumed (:meth:`stale_trials`)
        self.inherited = {t.number for t in self._running()}

    def lease_key(self, number: int) -> str:
        return _lease_key(self.study.study_name, number)

    @property
    def ask_key(self) -> str:
        """The study's ask lease: held by the one run counting its trials and asking new ones."""
        return f"{self.study.study_name}#ask"

    def _running(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(State.RUNNING,))

    def stale_trials(self) -> list[Ticket]:
        """Up to ``batch`` trials left RUNNING (by an interrupted or dead run) whose lease this
        run could take: resumed under their own numbers."""
        tickets: list[Ticket] = []
        for t in self._running():
            if len(tickets) == self.batch:
                break
            if not self.leases.acquire(self.lease_key(t.number), self.owner):
                continue
            if self._finished_meanwhile(t):
                continue
            if set(self.space) - set(t.params):
                resampled = self._sample_again(t)
                if resampled is None:  # another run is asking it now: the trial is its
                    self.leases.release(self.lease_key(t.number), self.owner)
                    continue
                t = resampled
            self._set_state(t.number, RESUMED)
            tickets.append(_ticket(t))
        return tickets

    def _sample_again(self, t: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial | None:
        """A trial whose run died inside ``study.ask``: created, its parameters not (all)
        written. They are sampled again as at its ask (:meth:`_ask_due`): the sampler seeded
        for its number, over the same finished trials (none is asked while it is unfinished),
        so the trial gets the clean run's parameters, not the damper's defaults; an enqueued
        trial's fixed parameters come back as they were. None while another run holds the
        study's ask lease: that run is asking this trial now (it is not dead)."""
        if not self.leases.acquire(self.ask_key, self.owner):
            return None
        try:
            self.study.sampler = sampler_for(self.settings, t.number, self.study.study_name,
                                             len(self.space))

            def suggest() -> None:
                trial = trial_handle(self.study, t._trial_id)
                for name, distribution in self.space.items():
                    if name in t.params:  # written before the death
                        _draw_again(trial, name, distribution)
                    trial._suggest(name, distribution)  # what study.ask(space) does

            with_storage_retries(suggest)
            return self._frozen(t)
        finally:
            self.leases.release(self.ask_key, self.owner)

    def _finished_meanwhile(self, t: optuna.trial.FrozenTrial) -> bool:
        """Whether the run that held ``t``'s lease finished it between our reading it RUNNING
        and our taking its lease (it tells Optuna, then releases); if so, give the lease back."""
        state = with_storage_retries(lambda: self.study._storage.get_trial(t._trial_id).state)
        if state == State.RUNNING:
            return False
        self.leases.release(self.lease_key(t.number), self.owner)
        return True

    def held_elsewhere(self) -> int:
        """RUNNING trials another live run holds the lease of."""
        return sum(self.leases.held_by_other(self.lease_key(t.number), self.owner)
                   for t in self._running())

    def all_finished(self) -> bool:
        """Whether the study holds its ``total`` trials, all finished (one read; called between
        this run's batches). No trial running is not enough: another run's trial may have just
        finished, before that run asked the next one."""
        trials = self.study.get_trials(deepcopy=False)
        return (not any(t.state == State.RUNNING for t in trials)
                and sum(t.state in FINISHED for t in trials) >= self.total)

    def next_batch(self) -> list[Ticket] | None:
        """New trials to train (only those whose lease this run took: between ask and acquire
        another run may have taken one over), or None when no new trial is due. Every RUNNING
        trial counts as due already, leased or not: another run may have asked it and not yet
        taken its lease (counting only leased ones, two runs starting at once asked one trial
        too many), and one nobody holds is resumed (:meth:`stale_trials`), never replaced.
        None too while a trial an earlier run left RUNNING (:attr:`inherited`) is unfinished."""
        with self._asking():
            return self._ask_due()

    @contextlib.contextmanager
    def _asking(self) -> Any:
        """One run at a time counts the study's trials and asks new ones (a lease on the
        study's name, held for that moment): two runs that counted at once each saw a trial
        due, and the study got one trial more than its budget."""
        while not self.leases.acquire(self.ask_key, self.owner):
            time.sleep(0.05)
        try:
            yield
        finally:
            self.leases.release(self.ask_key, self.owner)

    def _ask_due(self) -> list[Ticket] | None:
        trials = self.study.get_trials(deepcopy=False)  # one read: finished and running agree
        running = [t for t in trials if t.state == State.RUNNING]
        finished = sum(t.state in FINISHED for t in trials)
        remaining = self.total - finished - len(running)
        if remaining <= 0 or any(t.number in self.inherited for t in running):
            return None
        tickets: list[Ticket] = []
        for _ in range(min(self.batch, remaining)):
            self.study.sampler = sampler_for(self.settings, len(self.study.trials),
                                             self.study.study_name, len(self.space))
            t = with_storage_retries(lambda: self.study.ask(self.space))
            if self.leases.acquire(self.lease_key(t.number), self.owner):
                tickets.append(_ticket(self._frozen(t)))
        return tickets

    def _frozen(self, t: optuna.Trial | optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial:
        """The trial as stored now (an asked, enqueued one carries its user attributes)."""
        return with_storage_retries(lambda: self.study._storage.get_trial(t._trial_id))

    def _handle(self, number: int) -> optuna.Trial:
        """The study's trial ``number`` to write to (one query, not the study's every trial)."""
        storage, study_id = self.study._storage, self.study._study_id
        trial_id = with_storage_retries(
            lambda: storage.get_trial_id_from_study_id_trial_number(study_id, number))
        return trial_handle(self.study, trial_id)

    def _set_state(self, number: int, value: str, *, attempts: int = 5) -> None:
        """Set trial ``number``'s :data:`DAMPTUNE_STATE` (it is RUNNING: writable)."""
        storage, study_id = self.study._storage, self.study._study_id

        def write() -> None:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            storage.set_trial_user_attr(trial_id, DAMPTUNE_STATE, value)

        with_storage_retries(write, attempts=attempts)

    def record(self, result: TrialResult) -> None:
        """Tell Optuna how the trial ended and release its lease. An INTERRUPTED trial stays
        RUNNING in Optuna, marked :data:`INTERRUPTED`: the next run resumes it."""
        key = self.lease_key(result.number)
        if result.state is TrialState.INTERRUPTED:
            down = isinstance(result.outage, StorageUnavailable)  # one try, not five
            with contextlib.suppress(Exception):  # unmarked: mark_stale finds it later
                self._set_state(result.number, INTERRUPTED, attempts=1 if down else 5)
            with contextlib.suppress(Exception):  # else the lease expires after its TTL
                self.leases.release(key, self.owner)
            return
        if result.state is TrialState.COMPLETE:
            handle = self._handle(result.number)
            for name, attr in result.user_attrs.items():
                with_storage_retries(functools.partial(handle.set_user_attr, name, attr))
            with_storage_retries(lambda: handle.set_constraint(TARGET_CONSTRAINT,
                                                               result.shortfall))
            with_storage_retries(lambda: self.study.tell(result.number, result.value))
        else:
            state = State.PRUNED if result.state is TrialState.PRUNED else State.FAIL
            value, step = result.value, result.examples_seen
            if state is State.PRUNED and value is not None and step:
                # its value so far where it stopped: the value Optuna gives a pruned trial
                handle = self._handle(result.number)
                with_storage_retries(lambda: handle.report(value, step=step))
            if state is State.FAIL:  # the message, shown with the trial in Optuna's dashboard
                handle = self._handle(result.number)
                with_storage_retries(lambda: handle.set_user_attr("fail_reason",
                                                                  result.reason[:2000]))
            with_storage_retries(lambda: self.study.tell(result.number, state=state))
        self.leases.release(key, self.owner)


def _draw_again(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> None:
    """Draw ``name`` again as ``Trial._suggest`` did at the ask, and drop the value (the stored
    one stays): ``study.ask`` writes parameters one at a time, and a run killed between two
    writes left the first. The seeded sampler's random state then moves past it as it did at
    the ask, so the parameters after it get the clean run's values (without this, the next
    parameter took the draw that was the first's)."""
    if (trial._is_fixed_param(name, distribution) or distribution.single()
            or trial._is_relative_param(name, distribution)):
        return  # no random draw at the ask: a warm-start seed's, a one-value or a joint one
    frozen = trial._get_latest_trial()
    study = optuna.pruners._filter_study(trial.study, frozen)
    trial.study.sampler.sample_independent(study, frozen, name, distribution)


def _lease_key(study_name: str, number: int) -> str:
    return f"{study_name}#{number}"


def mark_stale(storage: str, *, owner: str) -> list[tuple[str, int]]:
    """Mark :data:`INTERRUPTED` the trials of every study in ``storage`` that a dead run left
    RUNNING (a SIGKILL, a lost machine: nothing marked them on the way out). Such a trial's
    lease is free or expired and it started over a lease's TTL ago; ``owner`` holds its lease
    while marking it, so a run cannot take it over meanwhile. Returns (study, number) of each.
    """
    store, leases = storage_for(storage), leases_for(storage)
    started_before = datetime.datetime.now() - datetime.timedelta(seconds=leases.ttl)
    marked = []
    for s in with_storage_retries(store.get_all_studies):
        for t in _running_in(store, s._study_id):
            key = _lease_key(s.study_name, t.number)
            if (t.user_attrs.get(DAMPTUNE_STATE) == INTERRUPTED or t.datetime_start is None
                    or t.datetime_start > started_before or not leases.acquire(key, owner)):
                continue
            try:
                if _mark_if_running(store, t._trial_id):
                    marked.append((s.study_name, t.number))
            finally:
                leases.release(key, owner)
    return marked


def _running_in(store: optuna.storages.BaseStorage,
                study_id: int) -> list[optuna.trial.FrozenTrial]:
    def read() -> list[optuna.trial.FrozenTrial]:
        return store.get_all_trials(study_id, deepcopy=False, states=(State.RUNNING,))

    return with_storage_retries(read)


def _mark_if_running(store: optuna.storages.BaseStorage, trial_id: int) -> bool:
    """Mark the trial :data:`INTERRUPTED` if it is still RUNNING (not finished meanwhile)."""

    def mark() -> bool:
        if store.get_trial(trial_id).state != State.RUNNING:
            return False
        store.set_trial_user_attr(trial_id, DAMPTUNE_STATE, INTERRUPTED)
        return True

    return with_storage_retries(mark)
