"""The grid's SQLite databases are in WAL mode (tasks.sqlite): a reader in the middle of a read
(``damptune report``, the Optuna dashboard, a second run) no longer blocks the grid's writes, and
the mode is the file's, so every process that opens it uses it."""

import sqlite3

import optuna
import pytest

from tasks.search import storage_for
from tasks.sqlite import sqlite_file, use_wal
from tasks.tracking import client_for


def _mode(path) -> str:
    with sqlite3.connect(path) as db:  # another connection: what any process would see
        return db.execute("PRAGMA journal_mode").fetchone()[0]


def test_a_reader_mid_read_does_not_block_the_grids_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("DAMPTUNE_SQLITE_TIMEOUT", "0.2")  # a blocked write fails in 0.2 s
    path = tmp_path / "optuna.db"
    study = optuna.create_study(study_name="s", storage=storage_for(f"sqlite:///{path}"))
    assert _mode(path) == "wal"
    trial = study.ask()
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("BEGIN")  # a read transaction held open, as a long report query
        assert reader.execute("select count(*) from trials").fetchone() == (1,)
        study.tell(trial, 1.0)  # the rollback journal: 'database is locked' after 0.2 s
        study.set_user_attr("after", True)
        assert reader.execute("select count(*) from trial_values").fetchone() == (0,)
        reader.execute("COMMIT")  # its snapshot ends; the next read sees the writes
        assert reader.execute("select value from trial_values").fetchall() == [(1.0,)]
    finally:
        reader.close()
    assert [(t.state.name, t.value) for t in study.trials] == [("COMPLETE", 1.0)]


def test_an_in_process_mlflow_store_is_in_wal_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("DAMPTUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "grid" / "mlflow.db"
    client = client_for(f"sqlite:///{path}")
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "test_accuracy", 0.5, step=1)
    assert _mode(path) == "wal"  # the stack's server's: tests/infra/test_stack.py


def test_a_store_that_exists_keeps_its_rows_and_other_urls_are_left_alone(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # a rollback-journal database, as earlier grids made
        db.execute("create table t (x)")
        db.execute("insert into t values (1)")
    assert _mode(path) == "delete"
    assert use_wal(f"sqlite:///{path}") is True
    assert _mode(path) == "wal"
    with sqlite3.connect(path) as db:
        assert db.execute("select x from t").fetchall() == [(1,)]
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql://u@h/db", "file:x.db"):
        assert sqlite_file(url) is None
        assert use_wal(url) is False


@pytest.mark.parametrize("mode", ["wal", "delete"])
def test_a_database_that_cannot_be_switched_is_used_as_it_is(tmp_path, mode):
    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute(f"PRAGMA journal_mode={mode}")
        holder.execute("create table t (x)")
        holder.execute("BEGIN EXCLUSIVE")  # another process mid-write
        switched = use_wal(f"sqlite:///{path}", timeout=0.1)
        assert switched is (mode == "wal")  # already WAL; else locked: left as it is
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert _mode(path) == mode
