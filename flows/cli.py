"""``damptune tune`` and ``damptune report``: the pipeline's commands.

They plug into the engine's command line through the ``damptune.commands`` entry-point group
(pyproject.toml), so the engine never imports the pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import types
import typing
from typing import Any

__all__ = ["register_tune", "register_report"]


def _csv(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected comma-separated values: {exc}") from exc
    return parse


def _per_model(kind: type) -> Any:
    """The parser of one ``kind`` for every model (0.6) or one per model (mlp=0.6,cnn=0.85)."""
    example = "8 or mlp=16,cnn=8" if kind is int else "0.6 or mlp=0.6,cnn=0.85"

    def parse(text: str) -> Any:
        try:
            if "=" not in text:
                return kind(text)
            return {k.strip(): kind(v) for k, v in (p.split("=") for p in text.split(","))}
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected {example}: {exc}") from exc
    return parse


# flags that `damptune tune` took before its options were generated from the flow's
# parameters: kept beside the generated ones (--target-accuracy, --max-concurrent-cells)
_ALIASES = {"target_accuracy": ("--target",), "max_concurrent_cells": ("--concurrent-cells",)}


def _option_type(annotation: Any) -> Any:
    """The parser of a flow parameter's value on the command line: 2,4 for a list, 0.6 or
    mlp=0.6,cnn=0.85 for a number or a per-model dict, else the base type itself."""
    from flows.signature import base_type

    kind = base_type(annotation)
    if typing.get_origin(kind) is list:
        return _csv(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # {model: x} | x
        scalar = [a for a in typing.get_args(kind) if typing.get_origin(a) is not dict]
        return _per_model(base_type(scalar[0]))
    return kind


def _add_tune_options(parser: argparse.ArgumentParser) -> None:
    """One option per parameter of the ``tune`` flow, read from its source
    (:mod:`flows.signature`): ``--trials`` for ``trials`` and its type's parser; a switch for
    a parameter that defaults to true. Its help is written when it is printed
    (:class:`_FlowDefaultsFormatter`)."""
    from flows.signature import base_type, flow_params

    for p in flow_params():
        flag = "--" + p.name.replace("_", "-")
        if base_type(p.annotation) is bool:
            on = p.default is True
            parser.add_argument(flag.replace("--", "--no-") if on else flag, dest=p.name,
                                action="store_false" if on else "store_true", help=p.name)
            continue
        parser.add_argument(flag, *_ALIASES.get(p.name, ()), dest=p.name,
                            type=_option_type(p.annotation), help=p.name,
                            metavar=p.name.upper())


def _default_text(value: Any) -> str:
    """A flow default as ``damptune tune`` takes it: 2,4 for a list, mlp=12,cnn=10 for a dict,
    12 for 12.0; ``none`` for None."""
    def one(v: Any) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    if value is None:
        return "none"
    if isinstance(value, dict):
        return ",".join(f"{k}={one(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(one(v) for v in value)
    return one(value)


class _FlowDefaultsFormatter(argparse.HelpFormatter):
    """The help of a flow parameter's option, written when it is printed (so `damptune train`
    never imports Prefect, and `tune --help` imports only Prefect's docstring parser): the
    description the deployment's parameter schema gives it and the
    default of the ``tune`` flow's signature. A description that already says what its None
    default means gets no default appended."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        from flows.signature import flow_params, source_defaults, source_descriptions

        if action.dest not in {p.name for p in flow_params()}:
            return action.help or ""
        text = source_descriptions()[action.dest].replace("%", "%%")
        value = source_defaults()[action.dest]
        if action.const is not None:  # a switch against its default
            now, was = str(not value).lower(), str(value).lower()
            return f"{action.dest} {now} (default: {was}; {text})"
        if value is None and "default" in text:
            return text
        return f"{text} (default: {_default_text(value).replace('%', '%%')})"


def register_tune(sub: Any) -> None:
    t = sub.add_parser("tune", help="run the tuning grid in this process (no servers needed)",
                       description="Run the tuning grid in this process (no servers needed). "
                       "Each option is a parameter of the `tune` flow, as in `prefect "
                       "deployment run tune/grid --param NAME=VALUE`; here a list is "
                       "comma-separated (--networks 2,4) and a per-model value is "
                       "mlp=12,cnn=10.", argument_default=argparse.SUPPRESS,
                       formatter_class=_FlowDefaultsFormatter)
    _add_tune_options(t)
    t.add_argument("--no-progress", dest="no_progress", action="store_true")
    t.set_defaults(handler=_tune)


def _progress(storage: str, grid_name: str, total: int, stop: threading.Event) -> None:
    """A progress bar fed by the Optuna storage (finished trials of this grid)."""
    from tqdm import tqdm

    from tasks.search import finished_in_grid

    bar = tqdm(total=total, unit="trial", desc=f"grid {grid_name}", file=sys.stderr)
    while not stop.wait(2.0):
        try:
            bar.update(min(finished_in_grid(storage, grid_name), total) - bar.n)
        except Exception:  # noqa: BLE001 - the storage may not exist yet
            continue
    bar.close()


def _total_trials(settings: Any, cells: list[Any]) -> int:
    """The trials the grid will have in all: every stage's cells (search, replicas, selection,
    estimation, matched), as `make run`'s progress line counts them."""
    from flows.tune import stages
    from tasks.validation import expected_trials

    return sum(expected_trials(settings, c, cells) for c in stages(settings, cells))


def _tune(args: argparse.Namespace) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # damptune's loggers reach the run's logs in Prefect, as prefect.yaml's work pool sets
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "damptune")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    from damptune import interrupt
    from flows.prefect_server import temporary_prefect_server
    from flows.signature import flow_params
    from flows.tune import grid_of, tune
    from tasks.report import GridIncomplete
    from tasks.stores import StoreFault, check_stores

    given = {p.name: getattr(args, p.name) for p in flow_params() if hasattr(args, p.name)}
    settings, cells = grid_of(given)  # bad input fails here, before any server starts
    try:
        check_stores(settings)  # a full disk, a corrupt store, MLflow down: before any write
    except StoreFault as exc:  # not the input (status 2): the storage's fault
        print(f"damptune tune: store fault: {exc}", file=sys.stderr)
        return exc.exit_code
    # this process is the run: a SIGTERM, or a first Ctrl-C, checkpoints the trials, and the
    # grid ends interrupted (exit status 75) instead of the process dying by the signal
    interrupt.own_process()
    interrupt.install_sigterm_handler()
    ctrl_c = signal.getsignal(signal.SIGINT)  # given back when the run ends (main(): tests)
    interrupt.install_sigint_handler(say=lambda text: print(f"damptune tune: {text}",
                                                            file=sys.stderr, flush=True))
    stop = threading.Event()
    if not getattr(args, "no_progress", False):
        threading.Thread(target=_progress, daemon=True,
                         args=(settings.storage, settings.grid_name,
                               _total_trials(settings, cells),
                               stop)).start()
    os.makedirs(settings.run_dir, exist_ok=True)
    try:
        with temporary_prefect_server(os.path.join(settings.run_dir, "prefect-server.log")):
            rows = tune(**{**given, "run_dir": settings.run_dir, "storage": settings.storage,
                           "tracking_uri": settings.tracking_uri})
    except GridIncomplete as exc:  # the summary is written: show it, then say what is wrong
        _print_rows(exc.rows, as_json=False)
        print(f"damptune tune: {exc}", file=sys.stderr)
        return exc.exit_code
    except StoreFault as exc:  # a store failed since the check above (an outage)
        print(f"damptune tune: store fault: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        stop.set()
        if ctrl_c is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, ctrl_c)
    _print_rows(rows, as_json=False)
    print(f"summary: {settings.run_dir}/summary.md; report (ranking and figures): "
          f"{settings.run_dir}/report/report.md; damptune report --run-dir {settings.run_dir}")
    return 0


def register_report(sub: Any) -> None:
    r = sub.add_parser("report", help="rank each (network, model)'s algorithms by best "
                       "simulated time to the target; write the report and its figures")
    r.add_argument("--run-dir", default=os.path.join("runs", "grid"),
                   help="the grid's run directory (default runs/grid)")
    r.add_argument("--storage", default=None,
                   help="Optuna storage URL (default: SQLite in the run directory)")
    r.add_argument("--grid-name", default=None, help="only this grid's cells")
    r.add_argument("--checkpoint-root", default=None, help="where the trials' checkpoints are "
                   "(default: the grid's checkpoint_root, else the run directory)")
    r.add_argument("--out", default=None,
                   help="directory of the report's files and figures (default RUN_DIR/report)")
    r.add_argument("--json", action="store_true",
                   help="one JSON object per algorithm per (network, model) pair")
    r.set_defaults(handler=_report)


def _print_rows(rows: list[dict[str, Any]], *, as_json: bool) -> None:
    from tasks.report import COLUMNS

    for row in rows:
        if as_json:
            print(json.dumps({k: row[k] for k in (*COLUMNS, "best_trial")}))
            continue
        value = "-" if row["best_value"] is None else f"{row['best_value']:.4g} s" + (
            " (missed)" if row["reached"] is False else "")
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row["best_params"].items()) or "-"
        print(f"n{row['network']:<3} {row['algorithm']:<11} {row['model']:<8} best {value:<12}"
              f" {params:<40} complete {row['n_complete']}, pruned {row['n_pruned']}, "
              f"failed {row['n_failed']}" + (f", interrupted {row['n_interrupted']}"
                                              if row["n_interrupted"] else ""))


def _print_ranking(ranking: list[dict[str, Any]]) -> None:
    """Per (network, model) pair, its algorithms in rank order, with the cells' counts."""
    pair = None
    for row in ranking:
        if (row["network"], row["model"]) != pair:
            pair = (row["network"], row["model"])
            print(f"\n{row['model']} on {row['network']} ranks (search target "
                  f"{row.get('target_accuracy')}):")
            print(f"  {'#':<2} {'algorithm':<11} {'best (s)':>10} {'speedup':>8} {'reached':<8}"
                  f" {'updates':>7} {'epochs':>6} {'trial':>5}  counts c/p/f/i  best "
                  "hyperparameters")
        value = "-" if row["best_value"] is None else f"{row['best_value']:.4g}"
        speedup = (f"{row['speedup_vs_geodamplr']:.2f}x" if row["speedup_vs_geodamplr"]
                   else "-")
        reached = {True: "yes", False: "NO", None: "?"}[row["reached"]]
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row["best_params"].items()) or "-"
        counts = "/".join(str(row[k]) for k in ("n_complete", "n_pruned", "n_failed",
                                                 "n_interrupted"))
        print(f"  {row['rank'] or '-':<2} {row['algorithm']:<11} {value:>10} {speedup:>8} "
              f"{reached:<8} {_num(row['updates_to_target']):>7} "
              f"{_num(row['epochs_to_target']):>6} {_num(row['best_trial']):>5}  "
              f"{counts:<14} {params}")
        if row["history"] != "ok":
            print(f"     {row['history']}")


def _num(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# the held-out seeds' statistics of a cell, added to its `report --json` object as validation_*
VALIDATION_KEYS = ("mean", "ci", "n_seeds", "reached_seeds", "speedup", "speedup_low",
                   "speedup_high", "tied_best", "reliable", "rank")


def _report(args: argparse.Namespace) -> int:
    from damptune import ConfigError
    from tasks.answer import RANK_COLUMNS
    from tasks.report import REPORT_DIR, build_report, grid_rows, read_meta, write_report

    run_dir = os.path.abspath(args.run_dir)
    meta = read_meta(run_dir)
    storage = args.storage or f"sqlite:///{run_dir}/optuna.db"
    if not args.storage and not os.path.exists(os.path.join(run_dir, "optuna.db")):
        raise ConfigError("--run-dir", args.run_dir,
                          "a grid's run directory holding optuna.db (or give --storage)")
    grid_name = args.grid_name or meta.get("grid_name")
    rows = grid_rows(storage, grid_name=grid_name)
    if not rows:
        raise ConfigError("--run-dir" if not args.storage else "--storage",
                          args.storage or args.run_dir,
                          "an Optuna storage holding the cell studies of a grid (found none "
                          + (f"of grid {grid_name!r} " if grid_name else "")
                          + f"in {storage}); run `damptune tune` first or give --grid-name")
    root = args.checkpoint_root or meta.get("checkpoint_root") or ""
    report = build_report(rows, run_dir=run_dir, checkpoint_root=root, storage=storage,
                          grid_name=grid_name or str(rows[0].get("grid") or ""))
    out = os.path.abspath(args.out or os.path.join(run_dir, REPORT_DIR))
    written = write_report(report, out, title=f"Grid {grid_name or ''}".strip())
    if args.json:
        answer = {(a["network"], a["model"], a["algorithm"]): a for a in report["answer"]}
        for row in report["ranking"]:
            held_out = answer.get((row["network"], row["model"], row["algorithm"]), {})
            print(json.dumps({**{k: row.get(k) for k in RANK_COLUMNS},
                              **{f"validation_{k}": held_out.get(k) for k in VALIDATION_KEYS}}))
        print(f"report: {len(written)} files in {out}", file=sys.stderr)
        return 0
    if report["answer"]:
        from tasks.answer import answer_markdown

        print("The answer (held-out seeds):\n" + answer_markdown(report["answer"]))
    _print_ranking(report["ranking"])
    _print_locations(meta, storage=storage, run_dir=run_dir, out=out)
    return 0


def _print_locations(meta: dict[str, Any], *, storage: str, run_dir: str, out: str) -> None:
    tracking = meta.get("tracking_uri") or f"sqlite:///{run_dir}/mlflow.db"
    ui = tracking if tracking.startswith("http") else (
        f"run `mlflow ui --backend-store-uri {tracking}`")
    print(f"\nReport: {out}/report.md (figures: {out}/*.png)")
    print(f"Optuna storage: {storage} (optuna-dashboard {storage})")
    print(f"MLflow: {ui}")
    if meta.get("prefect_api_url"):
        print(f"Prefect UI: {meta['prefect_api_url'].removesuffix('/api')}")
    print(f"Summary: {run_dir}/summary.md")
