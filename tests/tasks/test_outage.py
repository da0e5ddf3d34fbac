"""The Optuna storage briefly unreachable: bounded retries, then a clear error; nothing lost.

Real SQLite: another process holds an EXCLUSIVE lock on the study's database (what a writer
sees when the database is unreachable; the study's database is in WAL mode, :mod:`tasks.sqlite`,
so its readers still read and its writes fail), with the busy timeout made short
(``DAMPTUNE_SQLITE_TIMEOUT``) so the test does not wait the default 60 s. The MLflow side is
tested with a real server taken down mid-grid in tests/flows/test_resume.py."""

import subprocess
import sys

import optuna
import pytest

from tasks.search import StorageUnavailable, storage_for, with_storage_retries

HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.setenv("DAMPTUNE_SQLITE_TIMEOUT", "0.2")
    path = tmp_path / "optuna.db"
    storage = storage_for(f"sqlite:///{path}")
    s = optuna.create_study(study_name="outage", storage=storage)
    for x in (1.0, 2.0):
        t = s.ask()
        s.tell(t, x)
    return path, s


def lock_for(path, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def counted(fn):
    """``fn`` that records how each call ended: "ok", or the name of what it raised."""
    def call():
        try:
            out = fn()
        except Exception as exc:
            call.outcomes.append(type(exc).__name__)
            raise
        call.outcomes.append("ok")
        return out

    call.outcomes = []
    return call


def test_a_brief_outage_is_ridden_out_by_the_retries(study):
    path, s = study
    trial = s.ask()
    holder = lock_for(path, 1.5)
    tell = counted(lambda: s.tell(trial, 3.0))
    with_storage_retries(tell, attempts=6, delay=0.25)
    # it really met the lock and retried until it went: failed attempts, then one success
    *failed, last = tell.outcomes
    assert failed and last == "ok", tell.outcomes
    assert set(failed) <= {"OperationalError", "StorageInternalError"}, tell.outcomes
    holder.wait(10)
    assert [t.value for t in s.trials] == [1.0, 2.0, 3.0]  # no trial twice


def test_a_long_outage_ends_in_a_clear_error_and_loses_nothing(study):
    path, s = study
    trial = s.ask()
    holder = lock_for(path, 30)
    try:
        with pytest.raises(StorageUnavailable, match=r"did not answer after 3 attempts.*"
                                                     r"Nothing was lost"):
            with_storage_retries(lambda: s.tell(trial, 3.0), attempts=3, delay=0.1)
    finally:
        holder.kill()
        holder.wait(10)
    assert [(t.state.name, t.value) for t in s.trials] == [("COMPLETE", 1.0),
                                                            ("COMPLETE", 2.0),
                                                            ("RUNNING", None)]
