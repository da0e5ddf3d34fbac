"""The grid's report at the end of the flow: written to ``<run_dir>/report/``, logged to the
grid's MLflow summary run under ``report/``, and shown as Prefect artifacts (the ranking as
Markdown, each figure as an image served by the MLflow server, or a link to its file).

Every step is a convenience over results that are already in Optuna: a failure is logged as a
warning and never fails the grid; what was written before it is kept.
"""

from __future__ import annotations

import os
import re
from typing import Any

from mlflow.tracking import MlflowClient
from prefect.artifacts import (
    create_image_artifact,
    create_link_artifact,
    create_markdown_artifact,
)

from tasks import tracking
from tasks.answer import ranking_markdown
from tasks.grid import GridSettings
from tasks.logs import run_logger
from tasks.report import REPORT_DIR, build_report, write_report

__all__ = ["publish_report", "artifact_key"]


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key: lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def publish_report(settings: GridSettings, rows: list[dict[str, Any]], *,
                   client: MlflowClient, summary_run_id: str | None) -> list[str]:
    """Write the report of ``rows`` (the grid's summary rows) into ``<run_dir>/report``, log
    that directory to the MLflow run ``summary_run_id`` (if any) under ``report/``, and create
    the Prefect artifacts. Returns the warnings (each also logged); never raises."""
    log = run_logger()
    warnings: list[str] = []
    figure_errors: list[str] = []
    out = os.path.join(settings.run_dir, REPORT_DIR)
    try:
        report = build_report(rows, run_dir=settings.run_dir,
                              checkpoint_root=settings.checkpoint_root,
                              storage=settings.storage, grid_name=settings.grid_name)
        written = write_report(report, out, title=f"Grid {settings.grid_name}",
                               errors=figure_errors)
    except Exception as exc:  # noqa: BLE001 - the results are in Optuna; the report can wait
        warnings.append(f"the grid's report was not written ({type(exc).__name__}: {exc}); "
                        f"the results are in Optuna: `damptune report --run-dir "
                        f"{settings.run_dir}` writes it")
        log.warning("%s", warnings[-1])
        return warnings
    for error in figure_errors:
        warnings.append(f"a figure of the report was not drawn: {error}")
        log.warning("%s", warnings[-1])
    run_id = None
    if summary_run_id:
        try:
            tracking.with_retries(lambda: tracking.log_report(client, summary_run_id, out),
                                  what="logging the grid's report")
            run_id = summary_run_id
        except Exception as exc:  # noqa: BLE001 - the files stay in the run directory
            warnings.append(f"the report was not logged to MLflow ({exc}); it is in {out}")
            log.warning("%s", warnings[-1])
    try:
        _artifacts(settings, report, written, run_id=run_id)
    except Exception as exc:  # noqa: BLE001 - Prefect's UI is a view of files we kept
        warnings.append(f"the report's Prefect artifacts were not created ({exc}); "
                        f"the report is in {out}")
        log.warning("%s", warnings[-1])
    return warnings


def _artifacts(settings: GridSettings, report: dict[str, Any], written: list[str], *,
               run_id: str | None) -> None:
    """The ranking as a Markdown artifact; each figure as an image artifact (served by the
    MLflow tracking server) or, without one, a link to its file."""
    grid = settings.grid_name
    lines = []
    for path in (p for p in written if p.endswith(".png")):
        name = os.path.basename(path)
        url = (tracking.artifact_url(settings.tracking_uri, run_id, f"{REPORT_DIR}/{name}")
               if run_id else None)
        key = artifact_key("report", grid, name.removesuffix(".png"))
        if url:
            create_image_artifact(image_url=url, key=key,
                                  description=f"grid {grid}: {name} (MLflow run {run_id})")
            lines.append(f"- [{name}]({url})")
        else:
            create_link_artifact(link=f"file://{os.path.abspath(path)}", link_text=path,
                                 key=key, description=f"grid {grid}: {name}")
            lines.append(f"- {name}: `{os.path.abspath(path)}`")
    create_markdown_artifact(
        markdown=f"# Grid `{grid}`: which algorithm reaches the target first\n\n"
        + ranking_markdown(report["ranking"]) + "\n## Figures\n\n" + "\n".join(lines) + "\n",
        key=artifact_key("report", grid),
        description="per (network, model): the algorithms ranked by best simulated time to "
                    "the target accuracy, and their speedup over geodamplr")
