"""The grid's summary, read back from the Optuna storage: rows, CSV, Markdown."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from typing import Any

import optuna

from damptune import ConfigError, DamptuneError
from damptune.checkpoint import load_checkpoint
from damptune.netmodel import REPLAY_PROFILES
from tasks.answer import (
    BASELINE,
    RANK_COLUMNS,
    answer_markdown,
    eval_curve,
    profiles_markdown,
    progress_to_target,
    rank_cells,
    ranking_markdown,
    replay_on_profiles,
)
from tasks.figures import draw_figures
from tasks.grid import Cell, GridSettings, checkpoint_path, never_grows, share_rows
from tasks.headroom import headroom_markdown, headroom_rows
from tasks.objective import objective_of, value_name
from tasks.search import storage_for, study_objective, summarize
from tasks.stats import ANSWER_COLUMNS, answer_rows
from tasks.stores import META, check_meta
from tasks.validation import validation_rows

__all__ = ["grid_rows", "write_summary", "COLUMNS", "read_meta", "write_meta", "GridIncomplete",
           "build_report", "write_report", "REPORT_DIR", "PROFILE_COLUMNS"]

COLUMNS = ("network", "algorithm", "model", "best_value", "reached", "best_params",
           "n_complete", "n_pruned", "n_failed", "n_interrupted", "study")
NAMED_CELLS = 6  # cells a GridIncomplete names of those not started (the rest: a count)


class GridIncomplete(RuntimeError):
    """The grid ran, but not all of it succeeded: trials ended FAIL, trials were left
    interrupted (checkpointed; a rerun continues them) or cells stopped with an error. Raised
    after the summary is written, so the flow run ends Failed with this message and
    ``damptune tune`` exits with :attr:`exit_code`."""

    def __init__(self, rows: list[dict[str, Any]], failures: list[str],
                 validated: list[dict[str, Any]] | None = None,
                 not_started: list[str] | None = None) -> None:
        """``rows``: the search cells' summaries; ``validated``: the validation cells',
        counted with them; ``not_started``: the cells a stop came before (their keys)."""
        self.rows, self.failures, self.not_started = rows, failures, list(not_started or [])
        counted = rows + list(validated or [])
        self.n_failed = sum(int(r["n_failed"]) for r in counted)
        self.n_interrupted = sum(int(r["n_interrupted"]) for r in counted)
        parts = [f"{self.n_failed} trial(s) FAIL", f"{self.n_interrupted} interrupted"]
        if failures:
            parts.append(f"{len(failures)} cell(s) stopped: " + "; ".join(failures))
        if self.not_started:
            named = ", ".join(self.not_started[:NAMED_CELLS]) + (
                f" and {len(self.not_started) - NAMED_CELLS} more"
                if len(self.not_started) > NAMED_CELLS else "")
            parts.append(f"{len(self.not_started)} cell(s) not started, a stop came first: "
                         + named)
        advice = ("interrupted trials are checkpointed and a rerun of the grid continues them"
                  if self.n_interrupted or failures
                  else "a rerun of the grid runs the cells not started" if self.not_started
                  else "")
        super().__init__("the grid did not complete: " + ", ".join(parts)
                         + (f" ({advice})" if advice else ""))

    @property
    def exit_code(self) -> int:
        """1 when trials failed or a cell stopped; 75 (EX_TEMPFAIL: run it again) when trials
        were only interrupted (or cells not started: a stop came first)."""
        return 1 if self.n_failed or self.failures else 75


def grid_rows(storage: str, *, grid_name: str | None = None,
              stage: str = "search", replicas: bool = False) -> list[dict[str, Any]]:
    """One row per cell study found in ``storage`` (optionally only one grid's): the cell's
    summary (:func:`tasks.search.summarize`) with its study's ``grid``, ``target_accuracy`` and
    ``profile``. The baseline's repeated searches (replicas 1 … R-1) only with ``replicas``
    (their rows carry ``replica``)."""
    rows = []
    store = storage_for(storage)
    for s in optuna.get_all_study_summaries(store, include_best_trial=False):
        attrs = s.user_attrs
        if "algorithm" not in attrs or (grid_name and attrs.get("grid") != grid_name):
            continue
        if attrs.get("stage", "search") != stage:  # search cells, or validation cells
            continue
        if attrs.get("replica", 0) and not replicas:  # a repeated search of the baseline
            continue
        study = optuna.load_study(study_name=s.study_name, storage=store)
        cell = Cell(int(attrs["network"]), str(attrs["algorithm"]), str(attrs["model"]),
                    stage=stage, replica=int(attrs.get("replica", 0)))
        rows.append({**summarize(study, cell), "grid": attrs.get("grid"),
                     "replica": cell.replica,
                     "target_accuracy": attrs.get("target_accuracy"),
                     "objective": study_objective(attrs),
                     "profile": attrs.get("profile")})
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
    """``grid.json``, written whole or not at all (a full disk leaves the old one as it was)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, META)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def check_run_dir(run_dir: str, grid_name: str) -> None:
    """Refuse a grid in another grid's run directory (its ``grid.json`` names another grid):
    the two would share checkpoint paths, and one's trials would resume from the other's. A
    ``grid.json`` that cannot be read, or is damaged, is a :class:`tasks.stores.StoreFault`
    naming it (:func:`tasks.stores.check_meta`; left as it is)."""
    check_meta(run_dir, grid_name)
    recorded = read_meta(run_dir).get("grid_name")
    if recorded is not None and recorded != grid_name:
        raise ConfigError("grid_name", grid_name,
                          f"{recorded!r}, the grid whose run_dir is {run_dir!r}",
                          "Give each grid its own run_dir (the default is runs/<grid_name>).")


def read_meta(run_dir: str) -> dict[str, Any]:
    path = os.path.join(run_dir, META)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return dict(json.load(f))


# -- the report: the ranking, the best trials' histories, their replay on every profile ---------
REPORT_DIR = "report"


def _evidence(row: dict[str, Any], *, run_dir: str,
              checkpoint_root: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What the cell's best trial's checkpoint says: its progress to the target and a status
    (``"ok"`` or why the history is unavailable), and the checkpoint itself (None if
    unavailable)."""
    if row["best_trial"] is None:
        return {**progress_to_target([], target=1.0), "reached": None,
                "history": "no COMPLETE trial"}, None
    cell = Cell(int(row.get("searched_network", row["network"])), str(row["algorithm"]),
                str(row["model"]))  # a shared cell's checkpoints are its search's
    grid = GridSettings(grid_name=str(row.get("grid") or ""), run_dir=run_dir,
                        checkpoint_root=checkpoint_root)
    path = checkpoint_path(grid, cell, int(row["best_trial"]))
    try:
        if row.get("target_accuracy") is None:
            raise KeyError(f"the study {row['study']!r} has no user attribute target_accuracy")
        ckpt = load_checkpoint(path)
        progress = progress_to_target(ckpt["history"], target=float(row["target_accuracy"]))
    except (DamptuneError, KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        return {**progress_to_target([], target=1.0), "reached": row.get("reached"),
                "history": f"history unavailable: {message}"}, None
    return {**progress, "history": "ok"}, ckpt


def build_report(rows: list[dict[str, Any]], *, run_dir: str, checkpoint_root: str = "",
                 storage: str = "", grid_name: str = "") -> dict[str, Any]:
    """The report of a grid's summary rows (:func:`grid_rows`): ``ranking`` (one row per cell,
    ranked within its (network, model) pair), ``curves`` (each best trial's evaluations) and
    ``profiles`` (each best trial's time to the target replayed on every named profile).

    Checkpoints are read from ``checkpoint_root`` (default ``run_dir``), where the trials
    wrote them; a missing or unreadable one makes its row say "history unavailable"."""
    cells, curves, profiles = [], [], []
    for row in share_rows(rows):
        evidence, ckpt = _evidence(row, run_dir=run_dir, checkpoint_root=checkpoint_root)
        cells.append({**row, **evidence})
        if ckpt is None:
            continue
        key = {"network": row["network"], "model": row["model"], "algorithm": row["algorithm"]}
        curves.append({**key, "curve": eval_curve(ckpt["history"])})
        try:
            replay = replay_on_profiles(ckpt, target=float(row["target_accuracy"]),
                                        objective=objective_of(row))
        except (DamptuneError, KeyError, TypeError, ValueError) as exc:
            cells[-1]["history"] = f"ok; replay on the profiles unavailable: {exc}"
            continue
        profiles += [{**key, **r} for r in replay]
    answer = (answer_rows(share_rows(validation_rows(storage, grid_name=grid_name)),
                          baseline=BASELINE) if storage and grid_name else [])
    grid = GridSettings(grid_name=grid_name, run_dir=run_dir, checkpoint_root=checkpoint_root)
    headroom = (headroom_rows(cells, grid=grid, profiles=(None, *REPLAY_PROFILES))
                if storage and grid_name else [])
    return {"ranking": rank_cells(cells), "curves": curves, "profiles": profiles,
            "answer": answer, "headroom": headroom,
            "searches": _searches(storage, grid_name) if storage and grid_name else {}}


def _searches(storage: str, grid_name: str) -> dict[str, int]:
    """Independent searches per ``<model>/<algorithm>`` at the smallest network they were
    searched at (the baseline's replicas count: R; any other algorithm: 1)."""
    out: dict[str, int] = {}
    for r in grid_rows(storage, grid_name=grid_name, replicas=True):
        key = f"{r['model']}/{r['algorithm']}/n{r['network']}"
        out[key] = out.get(key, 0) + 1
    return out


def _budget(ranking: list[dict[str, Any]], searches: dict[str, int] | None = None) -> str:
    """The search budget each algorithm had, per model: its cells, their independent searches
    (the baseline's R) and finished trials; then the flat searches (:func:`_flat`)."""
    searched: dict[tuple[str, str], list[int]] = {}
    for r in ranking:
        if not r.get("shared_from"):
            searched.setdefault((r["model"], r["algorithm"]), []).append(
                int(r["n_complete"]) + int(r["n_pruned"]) + int(r["n_failed"]))
    repeats = {tuple(k.split("/")[:2]): n for k, n in (searches or {}).items()}
    lines = ["| model | algorithm | cells searched | searches per cell | finished trials per "
             "search (min–max) |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {a} | {len(n)} | {repeats.get((m, a), 1)} | {min(n)}–{max(n)} |"
              for (m, a), n in sorted(searched.items())]
    shared = sorted({r["algorithm"] for r in ranking if r.get("shared_from")})
    note = (f"\n{', '.join(shared)} never grow the batch: searched at the smallest network "
            "only, and shown at every size (`shared_from`).\n" if shared else "")
    repeated = sorted({a for (_, a), n in repeats.items() if n > 1})
    if repeated:
        most = max(repeats.values())
        note += (f"\n{', '.join(repeated)} (the baseline) searched {most} times per model, "
                 f"independently: it got {most}× the search of each damped algorithm, and its "
                 "best was chosen on the selection seeds. This is the conservative comparison: "
                 "damping must beat a well-tuned baseline.\n")
    return ("Search budget per model and algorithm:\n\n" + "\n".join(lines) + "\n" + note
            + _flat(ranking) + "\n")


def _flat(ranking: list[dict[str, Any]]) -> str:
    """The cells whose search is flat: every finished trial has the same value, so the
    damper's hyperparameters had no effect here (a search that measured nothing)."""
    flat = [f"n{r['network']}/{r['algorithm']}/{r['model']}" for r in ranking
            if not r.get("shared_from") and r.get("distinct_values") == 1
            and int(r.get("n_values") or 0) > 1]
    if not flat:
        return ""
    return (f"\n**Flat searches: this hyperparameter has no effect here** ({', '.join(flat)}): "
            "every trial of the search took the same value.\n")


def _headroom_section(report: dict[str, Any]) -> str:
    """The cost model's ceiling per pair, beside the best damped speedup the answer measured."""
    if not report.get("headroom"):
        return ""
    measured = {}
    for row in report.get("answer", []):
        key = (row["network"], row["model"])
        if key not in measured and not never_grows(row["algorithm"]) and row.get("speedup"):
            measured[key] = float(row["speedup"])
    return ("## What the cost model lets damping win\n\n"
            "`s`: an epoch at the cap on P ranks against an epoch at B0 on one rank, on the "
            f"grid's profile. `φ`: the share of the baseline's {value_name(report['ranking'])} "
            "after the point where a damper could first grow: where the baseline's own damping "
            "first passes B0 (its first learning-rate decay). Every profile's: headroom.json. "
            "Ceiling: `1 / ((1 − φ) + φ / s)`, the most any damped schedule could win "
            "(statistical efficiency aside). Measured: the answer's best damped speedup "
            "(estimation seeds).\n\n"
            + headroom_markdown(_own_profile(report), measured) + "\n")


def _own_profile(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The ceiling rows on the grid's own profile, each pair's first
    (:func:`tasks.headroom.headroom_rows` lists it first): headroom.json holds every
    profile's."""
    first: dict[tuple[int, str], dict[str, Any]] = {}
    for r in report["headroom"]:
        first.setdefault((r["network"], r["model"]), r)
    return list(first.values())


def _answer_section(report: dict[str, Any]) -> str:
    if not report.get("answer"):
        return ""
    return ("## The answer: each cell's chosen configuration on the estimation seeds\n\n"
            "Each cell's configuration was chosen on selection seeds, then trained on "
            "estimation seeds that no choice saw (the same for every algorithm, data varying "
            f"with the seed). Mean {value_name(report.get('ranking', []))}, in seconds, over "
            "the estimation seeds; speedups are paired by seed (geometric mean, 95 % CI). "
            f"`updates ×` and `epochs ×`: model updates and epochs to the target against "
            f"{BASELINE}'s, paired over the seeds both reached it on (below 1: fewer).\n\n"
            + answer_markdown(report["answer"]) + "\n")


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def _csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(columns)
    for r in rows:
        writer.writerow([json.dumps(r.get(c)) if isinstance(r.get(c), dict) else r.get(c)
                         for c in columns])
    return buf.getvalue()


PROFILE_COLUMNS = ("network", "model", "algorithm", "profile", "reached", "seconds", "updates")


def write_report(report: dict[str, Any], out_dir: str, *, title: str = "",
                 errors: list[str] | None = None) -> list[str]:
    """``report.json``/``.md``/``.csv``, ``profiles.csv``/``.md`` and the figures in
    ``out_dir``; returns the paths written. Each file is replaced whole (written aside,
    then renamed). With ``errors``, a figure that cannot be drawn is left out and the reason
    appended there (the tables are written all the same); without it, the error is raised."""
    os.makedirs(out_dir, exist_ok=True)
    ranking = report["ranking"]
    figures = draw_figures(report, out_dir, errors=errors)
    files = {
        "report.json": json.dumps([{c: r.get(c) for c in RANK_COLUMNS} for r in ranking],
                                  indent=1) + "\n",
        "report.csv": _csv_text(ranking, RANK_COLUMNS),
        "profiles.csv": _csv_text(report["profiles"], PROFILE_COLUMNS),
        "profiles.md": profiles_markdown(report["profiles"]) if report["profiles"] else "",
        "answer.json": json.dumps([{c: r.get(c) for c in ANSWER_COLUMNS}
                                   for r in report.get("answer", [])], indent=1) + "\n",
        "headroom.json": json.dumps(report.get("headroom", []), indent=1) + "\n",
        "report.md": (f"# {title or 'Grid report'}\n\n" + _answer_section(report)
                      + _headroom_section(report)
                      + "## The search: best trial per cell\n\n"
                      + _budget(ranking, report.get("searches"))
                      + ranking_markdown(ranking)
                      + f"\n## Replayed on every network profile ({value_name(ranking)}, s)\n\n"
                      + (profiles_markdown(report["profiles"]) if report["profiles"]
                         else "no history available\n") + "\n## Figures\n\n"
                      + "".join(f"![{os.path.basename(p)}]({os.path.basename(p)})\n"
                                for p in figures)),
    }
    for name, text in files.items():
        _write_atomic(os.path.join(out_dir, name), text)
    return [os.path.join(out_dir, name) for name in files] + figures
