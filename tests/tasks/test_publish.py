"""The report at the end of the flow (tasks/publish.py): files in the run directory, the MLflow
summary run's ``report/`` artifacts, Prefect artifacts that show the figures; a failure is a
warning that keeps what was written. Real MLflow stores (SQLite, and a real server), a real
Prefect API (the test harness)."""

import os
import signal
import urllib.request

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

import tasks.figures
from infra.stack import free_port
from tasks import tracking
from tasks.figures import FIGURES
from tasks.grid import GridSettings
from tasks.publish import publish_report
from tests.flows.grids import mlflow_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def rows(grid):
    """Summary rows of two cells whose best trials' checkpoints are gone (a run directory
    copied without its checkpoints): the ranking stands, the histories are unavailable."""
    common = {"grid": grid, "model": "mlp", "network": 4, "target_accuracy": 0.5,
              "profile": "decentralized-moderate", "n_complete": 1, "n_pruned": 0,
              "n_failed": 0, "n_interrupted": 0, "best_trial": 0, "reached": True}
    return [{**common, "algorithm": a, "best_value": v, "best_params": {"factor": 2.0},
             "study": f"{grid}/n4/{a}/mlp"} for a, v in (("geodamplr", 6.0), ("geodamp", 3.0))]


def setup(tmp_path, grid, tracking_uri=None):
    settings = GridSettings(grid_name=grid, run_dir=str(tmp_path / grid),
                            tracking_uri=tracking_uri or f"sqlite:///{tmp_path}/mlflow.db")
    client = tracking.client_for(settings.tracking_uri)
    exp = tracking.experiment_id(client, grid_name=grid,
                                 artifact_root=f"{settings.run_dir}/mlartifacts")
    run_id = tracking.log_grid_summary(client, exp, grid_name=grid, rows=rows(grid), files=())
    return settings, client, run_id


def artifacts(grid):
    with get_client(sync_client=True) as prefect:
        found = prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(like_=f"report-{grid}")))
    return {a.key: a for a in found}


def test_report_files_mlflow_artifacts_and_prefect_links(tmp_path):
    settings, client, run_id = setup(tmp_path, "pub")
    assert publish_report(settings, rows("pub"), client=client, summary_run_id=run_id) == []
    out = tmp_path / "pub" / "report"
    assert {f.name for f in out.iterdir()} >= {*FIGURES, "report.md", "report.json"}
    logged = {a.path for a in client.list_artifacts(run_id, "report")}
    assert {f"report/{name}" for name in (*FIGURES, "report.md", "report.csv")} <= logged
    found = artifacts("pub")
    assert found["report-pub"].type == "markdown"
    assert "| 1 | geodamp | 3 | 2.00× |" in found["report-pub"].data
    assert "history unavailable" in found["report-pub"].data
    link = found["report-pub-time-vs-network"]  # Prefect stores a link as Markdown
    assert link.data == f"[{out}/time_vs_network.png](file://{out}/time_vs_network.png)"


def test_a_figure_or_mlflow_failure_is_a_warning_and_keeps_the_rest(tmp_path, monkeypatch):
    settings, client, _ = setup(tmp_path, "warn")

    def broken(report, **kwargs):
        raise RuntimeError("no display")

    monkeypatch.setattr(tasks.figures, "profiles_bars", broken)
    warnings = publish_report(settings, rows("warn"), client=client,
                              summary_run_id="0" * 32)  # a run MLflow does not know
    assert len(warnings) == 2, warnings
    assert "profiles.png: RuntimeError: no display" in warnings[0]
    assert "not logged to MLflow" in warnings[1]
    out = tmp_path / "warn" / "report"
    assert {f.name for f in out.iterdir()} >= {*FIGURES[:-1], "report.md", "report.json"}
    assert not (out / "profiles.png").exists()
    assert set(artifacts("warn")) >= {"report-warn", "report-warn-time-vs-network"}


def test_with_an_mlflow_server_the_figures_are_images_it_serves(tmp_path):
    port = free_port()
    server = mlflow_server(tmp_path / "mlflow", port)
    try:
        uri = f"http://127.0.0.1:{port}"
        settings, client, run_id = setup(tmp_path, "srv", tracking_uri=uri)
        assert publish_report(settings, rows("srv"), client=client, summary_run_id=run_id) == []
        image = artifacts("srv")["report-srv-time-vs-network"]
        assert image.type == "image"
        assert image.data == tracking.artifact_url(uri, run_id, "report/time_vs_network.png")
        with urllib.request.urlopen(image.data, timeout=30) as response:
            served = response.read()
        local = tmp_path / "srv" / "report" / "time_vs_network.png"
        assert served == local.read_bytes()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def test_artifact_urls_leave_credentials_out_and_local_stores_have_none():
    assert tracking.artifact_url("https://u:secret@mlflow.example:5000/", "abc",
                                 "report/a b.png") == (
        "https://mlflow.example:5000/get-artifact?path=report%2Fa+b.png&run_uuid=abc")
    assert tracking.artifact_url("sqlite:///x/mlflow.db", "abc", "report/a.png") is None
