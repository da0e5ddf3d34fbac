"""A run killed in the middle of Optuna's ``ask``: the trial exists, RUNNING, but its
parameters were never written (the sampler was still choosing them). The next run resumes it
with the parameters the clean run gave it, not with the damper's defaults.

Real components: Optuna on SQLite, the cell's StudyDriver and its leases.
"""

import optuna
import pytest

from tasks.driver import StudyDriver
from tasks.grid import Cell, GridSettings
from tasks.leases import Leases
from tasks.results import TrialResult, TrialState
from tasks.search import distributions, open_study

CELL = Cell(4, "geodamp", "mlp")
N_BEFORE = 3  # trials finished before the kill: past startup_trials, the model samples


def _driver(tmp_path, owner):
    tmp_path.mkdir(exist_ok=True)
    url = f"sqlite:///{tmp_path}/optuna.db"
    settings = GridSettings(run_dir=str(tmp_path), storage=url, trials=6, startup_trials=2)
    study = open_study(settings, CELL, n_train=4000)
    return StudyDriver(study, settings, leases=Leases(url), owner=owner,
                       space=distributions(settings, CELL), batch=1, total=6)


def _finish_first_trials(driver, n=N_BEFORE):
    for _ in range(n):
        ticket, = driver.next_batch()
        value = ticket.params["factor"] + ticket.params["delay"]  # deterministic in the params
        driver.record(TrialResult(ticket.number, TrialState.COMPLETE, ticket.params,
                                  value=value, reached=True, best_accuracy=0.7, shortfall=0.0))


def test_a_trial_killed_before_its_parameters_were_written_resumes_with_the_clean_runs(
        tmp_path):
    clean = _driver(tmp_path / "clean", "clean-run")
    _finish_first_trials(clean)
    expected, = clean.next_batch()
    assert expected.number == N_BEFORE and set(expected.params) == {"factor", "delay"}

    killed = _driver(tmp_path / "killed", "dead-run")
    _finish_first_trials(killed)
    # what `study.ask` had written when the process died: the trial, RUNNING, no parameters
    killed.study._storage.create_new_trial(killed.study._study_id)
    assert killed.study.trials[-1].params == {}

    rerun = _driver(tmp_path / "killed", "rerun")
    resumed, = rerun.stale_trials()
    assert (resumed.number, resumed.params) == (expected.number, expected.params)
    stored = rerun.study.trials[N_BEFORE]
    assert stored.state == optuna.trial.TrialState.RUNNING and stored.params == expected.params


def test_a_trial_another_run_is_asking_is_left_to_it(tmp_path):
    """The same trial while a live run is inside its `ask` (it holds the study's ask lease):
    another run does not take it over; the asking run's lease on it stays free."""
    asking = _driver(tmp_path, "asking-run")
    _finish_first_trials(asking)
    asking.study._storage.create_new_trial(asking.study._study_id)
    assert asking.leases.acquire(asking.ask_key, "asking-run")
    other = _driver(tmp_path, "other-run")
    assert other.stale_trials() == []
    assert asking.leases.acquire(asking.lease_key(N_BEFORE), "asking-run")


@pytest.mark.parametrize("n_before", [0, N_BEFORE], ids=["startup (random)", "model (GP)"])
def test_a_trial_killed_after_its_first_parameter_was_written_resumes_with_the_clean_runs(
        tmp_path, n_before):
    """``study.ask`` writes a trial's parameters one at a time, each as the sampler draws it:
    a run killed between the two writes of geodamp's ``factor`` and ``delay`` leaves the
    first. The rerun draws the missing one as the clean run did (the sampler's random state
    advanced past the written one), so the trial keeps the clean run's parameters."""
    clean = _driver(tmp_path / "clean", "clean-run")
    _finish_first_trials(clean, n_before)
    expected, = clean.next_batch()
    first, second = clean.space  # the order `study.ask` writes them in
    assert expected.number == n_before and set(expected.params) == {first, second}

    killed = _driver(tmp_path / "killed", "dead-run")
    _finish_first_trials(killed, n_before)
    trial_id = killed.study._storage.create_new_trial(killed.study._study_id)
    dist = killed.space[first]
    killed.study._storage.set_trial_param(trial_id, first,
                                          dist.to_internal_repr(expected.params[first]), dist)
    assert killed.study.trials[-1].params == {first: expected.params[first]}

    rerun = _driver(tmp_path / "killed", "rerun")
    resumed, = rerun.stale_trials()
    assert (resumed.number, resumed.params) == (expected.number, expected.params)
    assert rerun.study.trials[n_before].params == expected.params
