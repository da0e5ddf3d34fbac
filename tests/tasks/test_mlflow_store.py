"""A grid's new SQLite MLflow store is a copy of an empty one (tasks.mlflow_store): MLflow
accepts it as its own, it holds what MLflow would have built, and it never replaces a store."""

import sqlite3
import threading

import mlflow.store.db.utils as db_utils
import pytest
from mlflow.tracking import MlflowClient

from tasks import mlflow_store
from tasks.tracking import client_for


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """A cache of its own, run from ``tmp_path``; the list of MLflow's schema builds."""
    monkeypatch.setenv("DAMPTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    made: list[str] = []
    real = db_utils._initialize_tables

    def counted(engine):
        made.append(str(engine.url))
        return real(engine)

    monkeypatch.setattr(db_utils, "_initialize_tables", counted)
    return made


def _schema(path):
    """Tables and indexes with their columns, and the schema version (two builds by MLflow
    write a table's CHECK constraints in different orders)."""
    with sqlite3.connect(path) as db:
        names = sorted(db.execute("select type, name, tbl_name from sqlite_master"
                                  " where name not like 'sqlite_%'").fetchall())
        columns = {name: db.execute(f"pragma table_info('{name}')").fetchall()
                   for kind, name, _ in names if kind == "table"}
        return names, columns, db.execute("select version_num from alembic_version").fetchall()


def _a_run(client: MlflowClient) -> str:
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "test_accuracy", 0.5, step=3)
    return run.info.run_id


def test_new_stores_are_copies_mlflow_accepts_with_the_schema_it_builds(tmp_path, builds):
    own = MlflowClient(f"sqlite:///{tmp_path}/own.db")  # MLflow builds this one itself
    assert len(builds) == 1
    stores = [tmp_path / "grid" / f"g{i}" / "mlflow.db" for i in range(3)]
    clients = [client_for(f"sqlite:///{path}") for path in stores]
    assert len(builds) == 2, builds  # the empty store, once; then copies
    for path, client in zip(stores, clients, strict=True):
        assert _schema(path) == _schema(tmp_path / "own.db")
        # MLflow's Default experiment, made by MLflow on this store: its own artifact root
        assert client.get_experiment("0").artifact_location == own.get_experiment(
            "0").artifact_location
        run_id = _a_run(client)
        again = MlflowClient(f"sqlite:///{path}")  # reopened: the schema check passes
        assert again.get_metric_history(run_id, "test_accuracy")[0].value == 0.5
    assert len(builds) == 2


def test_a_store_that_exists_is_never_replaced(tmp_path, builds):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = _a_run(MlflowClient(uri))
    assert mlflow_store.prepare_sqlite_store(uri) is False
    assert MlflowClient(uri).get_run(run_id).data.metrics == {"test_accuracy": 0.5}
    for other in ("postgresql://user@host/db", "sqlite:///:memory:", "file:///tmp/mlruns"):
        assert mlflow_store.prepare_sqlite_store(other) is False
    assert not mlflow_store.template_path().exists()  # nothing needed it


def test_threads_that_open_one_new_store_make_it_once(tmp_path, builds):
    uri = f"sqlite:///{tmp_path}/grid/mlflow.db"
    made: dict[int, bool] = {}
    start = threading.Barrier(8)

    def prepare(i):
        start.wait(timeout=30)
        made[i] = mlflow_store.prepare_sqlite_store(uri)

    threads = [threading.Thread(target=prepare, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(made) == list(range(8)), made  # every thread ran to its end
    assert list(made.values()).count(True) == 1, made
    assert not list((tmp_path / "grid").glob("*.tmp-*"))  # no half copy left beside it
    run_id = _a_run(MlflowClient(uri))
    assert MlflowClient(uri).get_run(run_id).info.status == "RUNNING"
