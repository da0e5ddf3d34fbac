"""`make dashboard`: the real optuna-dashboard, started by the Makefile's recipe on a study's
SQLite storage, serves the study on 127.0.0.1 and shows a trial a dead run left RUNNING as
interrupted."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from infra.stack import REPO_ROOT, free_port
from tasks.driver import DAMPTUNE_STATE, INTERRUPTED
from tasks.leases import Leases

STUDY = "g/n2/geodamp/mlp"
LEASE_TTL_S = 1.0  # the dashboard's DAMPTUNE_LEASE_TTL: a trial older than that may be stale


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _study_with_a_dead_trial(storage: str) -> None:
    """Two finished trials, and one asked by a run that then died (its lease expired)."""
    study = optuna.create_study(study_name=STUDY, storage=storage)
    for x in (1.0, 2.0):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 4)})
        study.tell(trial, x)
    dead = study.ask({"x": optuna.distributions.FloatDistribution(0, 4)})
    Leases(storage, ttl=0.01).acquire(f"{STUDY}#{dead.number}", "dead-run")


def _wait_until_stale(storage: str, *, ttl: float) -> None:
    """Wait (within a deadline) until the dead run's trial is stale as the dashboard's start
    judges it (:func:`tasks.driver.mark_stale`): its lease expired, and it started more than a
    lease's TTL ago by the clock Optuna recorded its start with."""
    study = optuna.load_study(study_name=STUDY, storage=storage)
    [dead] = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    started, deadline = dead.datetime_start, time.monotonic() + 60
    assert started is not None
    with contextlib.closing(sqlite3.connect(storage.removeprefix("sqlite:///"))) as conn:
        [(expires,)] = conn.execute("SELECT expires FROM damptune_leases WHERE key = ?",
                                    (f"{STUDY}#{dead.number}",)).fetchall()
    while time.time() <= expires or (datetime.datetime.now() - started).total_seconds() <= ttl:
        assert time.monotonic() < deadline, "the dead run's trial never read stale"
        time.sleep(0.05)


def _make_dashboard(storage: str, port: int, log: Path) -> subprocess.Popen:
    """`make dashboard` (its recipe as a user runs it; the venv is this Python's, already
    installed: no stamp), in its own session so that it is stopped by its PID's group."""
    args = ["make", "--no-print-directory", "dashboard", f"STORAGE={storage}",
            f"DASHBOARD_PORT={port}", f"BIN={Path(sys.executable).parent}", "DASHBOARD_STAMP="]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT),
           "DAMPTUNE_LEASE_TTL": f"{LEASE_TTL_S:g}"}
    with open(log, "w") as out:
        return subprocess.Popen(args, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _wait_for_studies(proc: subprocess.Popen, url: str, log: Path) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            return _get(url)
        except OSError:
            assert proc.poll() is None, f"make dashboard exited:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
    raise AssertionError(f"the dashboard did not answer {url}:\n{log.read_text()[-3000:]}")


@pytest.mark.timeout(300)
def test_make_dashboard_serves_the_study_and_shows_a_dead_runs_trial_interrupted(tmp_path):
    if importlib.util.find_spec("optuna_dashboard") is None:
        if os.environ.get("CI"):  # `make test` installs .[dev], which has it
            pytest.fail("optuna-dashboard is absent in CI: the dev extra must install it")
        pytest.skip("optuna-dashboard is absent: pip install -e '.[dashboard]'")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study_with_a_dead_trial(storage)
    _wait_until_stale(storage, ttl=LEASE_TTL_S)
    port, log = free_port(), tmp_path / "dashboard.log"
    proc = _make_dashboard(storage, port, log)
    try:
        listed = _wait_for_studies(proc, f"http://127.0.0.1:{port}/api/studies", log)
        names = {s["study_name"]: s["study_id"] for s in listed["study_summaries"]}
        assert STUDY in names, listed
        trials = _get(f"http://127.0.0.1:{port}/api/studies/{names[STUDY]}")["trials"]
        states = {t["number"]: (t["state"], {a["key"]: a["value"] for a in t["user_attrs"]})
                  for t in trials}
        assert states == {0: ("Complete", {}), 1: ("Complete", {}),
                          2: ("Running", {DAMPTUNE_STATE: INTERRUPTED})}, states
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    with pytest.raises(OSError):  # stopped: nothing answers on the port any more
        _get(f"http://127.0.0.1:{port}/api/studies")
