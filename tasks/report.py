"""The grid's summary, read back from the Optuna storage: rows, CSV, Markdown."""

from __future__ import annotations

import csv
import json
import os
from typing import Any

import optuna

from tasks.cell import summarize
from tasks.grid import Cell
from tasks.search import storage_for

__all__ = ["grid_rows", "write_summary", "COLUMNS", "read_meta", "write_meta", "GridIncomplete"]

COLUMNS = ("network", "algorithm", "model", "best_value", "best_params", "n_complete",
           "n_pruned", "n_failed", "n_interrupted", "study")
META = "grid.json"


class GridIncomplete(RuntimeError):
    """The grid ran, but not all of it succeeded: trials ended FAIL, trials were left
    interrupted (checkpointed; a rerun continues them) or cells stopped with an error. Raised
    after the summary is written, so the flow run ends Failed with this message and
    ``damptune tune`` exits with :attr:`exit_code`."""

    def __init__(self, rows: list[dict[str, Any]], failures: list[str]) -> None:
        self.rows, self.failures = rows, failures
        self.n_failed = sum(int(r["n_failed"]) for r in rows)
        self.n_interrupted = sum(int(r["n_interrupted"]) for r in rows)
        parts = [f"{self.n_failed} trial(s) FAIL", f"{self.n_interrupted} interrupted"]
        if failures:
            parts.append(f"{len(failures)} cell(s) stopped: " + "; ".join(failures))
        advice = ("interrupted trials are checkpointed and a rerun of the grid continues them"
                  if self.n_interrupted or failures else "")
        super().__init__("the grid did not complete: " + ", ".join(parts)
                         + (f" ({advice})" if advice else ""))

    @property
    def exit_code(self) -> int:
        """1 when trials failed or a cell stopped; 75 (EX_TEMPFAIL: run it again) when trials
        were only interrupted."""
        return 1 if self.n_failed or self.failures else 75


def grid_rows(storage: str, *, grid_name: str | None = None) -> list[dict[str, Any]]:
    """One row per cell study found in ``storage`` (optionally only one grid's)."""
    rows = []
    store = storage_for(storage)
    for s in optuna.get_all_study_summaries(store, include_best_trial=False):
        attrs = s.user_attrs
        if "algorithm" not in attrs or (grid_name and attrs.get("grid") != grid_name):
            continue
        study = optuna.load_study(study_name=s.study_name, storage=store)
        cell = Cell(int(attrs["network"]), str(attrs["algorithm"]), str(attrs["model"]))
        rows.append(summarize(study, cell))
    rows.sort(key=lambda r: (r["network"], r["algorithm"], r["model"]))
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return "" if value is None else str(value)


def write_summary(rows: list[dict[str, Any]], run_dir: str) -> tuple[str, str]:
    """``summary.csv`` and ``summary.md`` in the run directory; returns their paths."""
    os.makedirs(run_dir, exist_ok=True)
    csv_path, md_path = os.path.join(run_dir, "summary.csv"), os.path.join(run_dir, "summary.md")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow([json.dumps(r[c]) if isinstance(r[c], dict) else r[c]
                             for c in COLUMNS])
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return csv_path, md_path


def write_meta(run_dir: str, meta: dict[str, Any]) -> None:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, META), "w") as f:
        json.dump(meta, f, indent=1)


def read_meta(run_dir: str) -> dict[str, Any]:
    path = os.path.join(run_dir, META)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return dict(json.load(f))
