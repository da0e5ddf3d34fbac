"""MLflow as the place to compare and pick: after a grid on a real MLflow server, the
registry's ``models:/<grid>-<model>-n<network>@best`` loads and predicts as the best trial's
own weights do; runs carry the dataset and system metrics (real Prefect harness, a real MLflow
server, Optuna on SQLite, a real Dask cluster)."""

import contextlib
import csv
import os
import signal
import subprocess
import sys

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from flows.tune import tune
from models import MLP, load_dataset
from tasks.trial_logger import EVALS_PER_EPOCH
from tests.flows.grids import mlflow_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

GRID = dict(networks=[2], algorithms=["geodamp", "padadamp"], models=["mlp"], trials=2,
            epochs=3, target_accuracy=0.45, validation_seeds=0)


def _best_trial_weights(run_dir):
    """The weights of the trial the grid's report ranks first (its ``report.csv``, rank 1 on
    2 ranks: what a user reads as the best), read from that trial's own checkpoint."""
    with open(os.path.join(run_dir, "report", "report.csv"), newline="") as f:
        [best] = [r for r in csv.DictReader(f) if (r["network"], r["rank"]) == ("2", "1")]
    path = os.path.join(run_dir, "checkpoints", f"n2/{best['algorithm']}/mlp",
                        f"trial-{best['best_trial']}.pt")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    module = MLP(input_shape=(40,), n_classes=10)
    module.load_state_dict(ckpt["model"])
    return best, module.eval(), ckpt["history"]


def _system_metrics(client, run_id):
    return {k for k in client.get_run(run_id).data.metrics if k.startswith("system/")}


def test_registry_best_loads_and_predicts_as_the_best_trial(tmp_path, scheduler, monkeypatch):
    from infra.stack import free_port

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = mlflow_server(tmp_path / "mlflow", port)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # what a user of models:/ URIs sets
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")  # trials are short
    run_dir = str(tmp_path / "r")
    try:
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, tracking_uri=uri, **GRID)
        best, trained, evaluated = _best_trial_weights(run_dir)
        ds = load_dataset("mnist1d", seed=0)

        loaded = mlflow.pyfunc.load_model("models:/g-mlp-n2@best")
        logits = loaded.predict(ds.X_test[:8])
        assert np.asarray(logits).shape == (8, 10)
        with torch.no_grad():
            expected = trained(torch.as_tensor(ds.X_test[:8])).numpy()
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)

        client = MlflowClient(uri)
        version = client.get_model_version_by_alias("g-mlp-n2", "best")
        run = client.get_run(version.run_id)  # the best trial's run
        assert run.data.tags["damptune.cell"] == f"n2/{best['algorithm']}/mlp"
        assert run.data.tags["damptune.trial_number"] == str(best["best_trial"])
        # its accuracy on the test set is the last one the trial logged
        accuracy = float(np.mean(np.argmax(loaded.predict(ds.X_test), 1) == ds.y_test))
        history = client.get_metric_history(run.info.run_id, "test_accuracy")
        last = max(history, key=lambda m: (m.step, m.timestamp))
        assert accuracy == pytest.approx(last.value, abs=1e-9)
        # the trial's evaluations, thinned to a chart (at most EVALS_PER_EPOCH per epoch) and
        # its last; one point per step: logging its model added none
        evals = [r for r in evaluated if r["kind"] == "eval"]
        steps = [m.step for m in history]
        assert last.step == evals[-1]["update"] and len(steps) == len(set(steps))
        assert len(steps) <= evals[-1]["epoch"] * EVALS_PER_EPOCH + 2 < len(evals)
        # the model in MLflow's Models tab shows the trial's final metrics
        [logged] = client.search_logged_models(
            [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
        assert {m.key: m.value for m in logged.metrics}["test_accuracy"] == last.value
        # the dataset is the run's input: name, digest, data_seed
        [data] = run.inputs.dataset_inputs
        assert (data.dataset.name, data.dataset.digest) == ("mnist1d", ds.digest())
        assert {(t.key, t.value) for t in data.tags} >= {("damptune.data_seed", "0")}
        assert "system/cpu_utilization_percentage" in _system_metrics(client, run.info.run_id)

        # a rerun that finds nothing new registers no second version
        tune(grid_name="g", run_dir=run_dir, cluster=scheduler, tracking_uri=uri, **GRID)
        versions = client.search_model_versions("name = 'g-mlp-n2'")
        assert [v.version for v in versions] == [version.version]
        assert client.get_model_version_by_alias("g-mlp-n2", "best").version == version.version
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_without_servers_the_best_is_registered_and_system_metrics_false_logs_none(
        tmp_path, scheduler, monkeypatch):
    """MLflow on SQLite (``damptune tune`` without servers): the registry holds the best too,
    nothing is written to the working directory's default store, and with
    ``system_metrics=False`` the trials' runs have no ``system/`` metrics."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    run_dir = str(tmp_path / "off")
    tune(grid_name="off", run_dir=run_dir, cluster=scheduler, system_metrics=False,
         **{**GRID, "algorithms": ["geodamp"]})
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    exp = client.get_experiment_by_name("damptune-off")
    runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'")
    assert len(runs) == 2
    assert all(not _system_metrics(client, r.info.run_id) for r in runs)
    assert all(r.data.metrics.get("objective") is not None for r in runs)  # they did train
    assert not (tmp_path / "mlflow.db").exists()  # MLflow's default store: untouched
    best = client.get_model_version_by_alias("off-mlp-n2", "best")
    assert client.get_run(best.run_id).data.tags["damptune.cell"] == "n2/geodamp/mlp"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{run_dir}/mlflow.db")
    model = mlflow.pyfunc.load_model("models:/off-mlp-n2@best")
    assert np.asarray(model.predict(load_dataset("mnist1d", seed=0).X_test[:3])).shape == (3, 10)


def test_cli_no_system_metrics_turns_them_off(tmp_path, scheduler, prefect_harness):
    """`damptune tune --no-system-metrics` (a real process, on the session's Prefect server):
    its trials' runs have none."""
    run_dir = tmp_path / "cli"
    env = {**os.environ, "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": prefect_harness}
    done = subprocess.run(
        [sys.executable, "-m", "damptune", "tune", "--networks", "2", "--algorithms",
         "geodamp", "--models", "mlp", "--trials", "2", "--epochs", "3", "--target", "0.45",
         "--validation-seeds", "0", "--grid-name", "cli", "--run-dir", str(run_dir),
         "--cluster", scheduler, "--no-progress", "--no-system-metrics"],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    exp = client.get_experiment_by_name("damptune-cli")
    runs = client.search_runs([exp.experiment_id], "tags.`damptune.kind` = 'trial'")
    assert len(runs) == 2 and all(r.data.metrics.get("objective") is not None for r in runs)
    assert all(not _system_metrics(client, r.info.run_id) for r in runs)
