"""How long does the real flow take on a sub-grid against the engine alone training the same
trials?

The flow ``tune`` runs in this process under a temporary Prefect server (started before the
clock), with its defaults apart from the grid (``--networks``, ``--algorithms``, both models,
``--trials`` per cell) and its own ``cluster="local"``, whose start counts: that is what a user
waits for. Then every trial it trained (not those that reused another's training,
:mod:`tasks.reuse`: the flow did not train them either) is replayed by the engine alone
(``damptune.train`` in ``local`` mode, one process) with the same hyperparameters, the
study's compute calibration and, for a pruned trial, its value as the bound, so it stops
where the trial stopped. The
baseline is the replay's total divided by the cores: the machine's floor for this work.

While the flow runs, the wall time spent in the pipeline's steps of a trial is summed over
the trials (threads run concurrently, so the steps of two trials overlap): this is the
per-trial breakdown. ``prefect + optuna ask/tell`` is a trial's Optuna duration less the time
inside its task's body.

Goal (issue 25): flow time <= 2x the baseline.

Run: ``python bench/grid_throughput.py [--trials 8] [--networks 2,16] [--validation-seeds 8]``
(the flow's validation and matched stages included by default: their trials are replayed with
their held-out seeds).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

GOAL = 2.0
_SPENT: collections.Counter[str] = collections.Counter()
_LOCK = threading.Lock()

# (label, module, attribute path) of the steps timed inside the flow
STEPS = (
    ("trial task body", "tasks.trial", "run_trial.fn"),
    ("dataset load", "tasks.trial", "load_dataset"),
    ("mlflow: open run", "tasks.trial", "MlflowTrialLogger.open"),
    ("mlflow: per-record metrics", "tasks.trial", "MlflowTrialLogger.__call__"),
    ("mlflow: finish (final metrics, plots queued)", "tasks.trial", "MlflowTrialLogger.finish"),
    ("optuna: open study, bound", "tasks.trial", "open_study"),
    ("optuna: report / should_prune", "tasks.trial", "PruningReporter.__call__"),
    ("compute calibration", "tasks.trial", "CalibrationKeeper.resolve"),
    ("engine train (ranks, segments, evals)", "tasks.trial", "train"),
    ("optuna: tell + record", "tasks.cell", "StudyDriver.record"),
    ("optuna: ask", "tasks.cell", "StudyDriver.next_batch"),
)


def _timed(label: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with _LOCK:
                _SPENT[label] += time.perf_counter() - t0
    return wrapper


def _instrument() -> None:
    import importlib

    for label, module, path in STEPS:
        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, _timed(label, getattr(owner, name)))


def _run_flow(args: argparse.Namespace, run_dir: str) -> float:
    from flows.tune import tune

    t0 = time.perf_counter()
    tune(grid_name="throughput", run_dir=run_dir, networks=args.networks,
         algorithms=args.algorithms, models=["mlp", "cnn"], trials=args.trials,
         validation_seeds=args.validation_seeds)
    return time.perf_counter() - t0


def _trials(run_dir: str) -> list[tuple[Any, Any, dict[str, Any]]]:
    """(cell, frozen trial, study calibration) of every finished trial of the grid, reused
    trainings included (:func:`_trained` leaves them out)."""
    import optuna

    from tasks.grid import Cell

    storage = f"sqlite:///{run_dir}/optuna.db"
    out = []
    for summary in optuna.get_all_study_summaries(storage):
        # <grid>/n<P>/<algorithm>/<model>[/<stage>]: search, validation or matched
        cell = Cell.from_key(summary.study_name.split("/", 1)[1])
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        calibration = study.user_attrs.get("compute_calibration", {})
        for t in study.get_trials(deepcopy=False):
            if t.value is not None:
                out.append((cell, t, calibration))
    return out


def _trained(trials: list[tuple[Any, Any, dict[str, Any]]]) -> list[tuple[Any, Any,
                                                                          dict[str, Any]]]:
    """The trials that trained: not those that took another's training (tasks.reuse)."""
    from tasks.reuse import REUSED_ATTR

    return [(c, t, cal) for c, t, cal in trials if REUSED_ATTR not in t.user_attrs]


def _replay(trials: list[tuple[Any, Any, dict[str, Any]]]) -> float:
    """Seconds the engine alone (local mode, one process) takes to train every trial."""
    import optuna

    from damptune import TrainData, train
    from damptune.trainer import with_calibration
    from models import load_dataset
    from tasks.grid import GridSettings
    from tasks.trial import trial_config
    from tasks.validation import TRAIN_SEED

    settings = GridSettings(mode="local")
    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    total = 0.0
    for cell, t, calibration in trials:
        bound = t.value if t.state == optuna.trial.TrialState.PRUNED else None
        seed = t.user_attrs.get(TRAIN_SEED)  # a validation trial's held-out seed
        config = with_calibration(trial_config(settings, cell, dict(t.params), ds, bound=bound,
                                               seed=seed), calibration)
        t0 = time.perf_counter()
        train(config, data)
        total += time.perf_counter() - t0
    return total


def _breakdown(trials: list[tuple[Any, Any, dict[str, Any]]]) -> None:
    n = len(trials)
    in_optuna = sum((t.datetime_complete - t.datetime_start).total_seconds()
                    for _, t, _ in trials if t.datetime_complete)
    rows = [(label, _SPENT[label]) for label, _, _ in STEPS]
    rows.append(("prefect + optuna ask/tell around the body", in_optuna - _SPENT["trial task "
                                                                               "body"]))
    print(f"\nPer-trial breakdown ({n} trials; seconds of wall per trial, summed over threads; "
          "nested steps are inside 'trial task body', 'engine train' includes the per-record "
          "callbacks)")
    print("| step | s per trial |")
    print("|---|---|")
    print(f"| trial, Optuna start to complete | {in_optuna / n:.3f} |")
    for label, spent in rows:
        print(f"| {label} | {spent / n:.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--networks", default="2,16")
    parser.add_argument("--algorithms", default="geodamplr,geodamp,padadamp")
    parser.add_argument("--validation-seeds", type=int, default=8,
                        help="the flow's held-out seeds per cell (its default; 0: search only)")
    args = parser.parse_args(argv)
    args.networks = [int(x) for x in args.networks.split(",")]
    args.algorithms = args.algorithms.split(",")
    from prefect.testing.utilities import prefect_test_harness

    _instrument()
    run_dir = os.path.join(tempfile.mkdtemp(prefix="damptune-throughput-"), "grid")
    with prefect_test_harness(server_startup_timeout=120):
        flow_seconds = _run_flow(args, run_dir)
    trials = _trials(run_dir)
    trained = _trained(trials)
    cores = os.cpu_count() or 1
    engine = _replay(trained)
    floor = engine / cores
    ratio = flow_seconds / floor
    stages = collections.Counter(cell.stage for cell, _, _ in trials)
    print(f"\n{len({cell for cell, _, _ in trials})} cells, {len(trials)} trials "
          f"({dict(stages)}; networks {args.networks}, algorithms {args.algorithms}, mlp and "
          f"cnn, {args.validation_seeds} held-out seeds), {len(trials) - len(trained)} of them "
          f"reused another's training (not replayed); {cores} cores")
    print("| run | seconds |")
    print("|---|---|")
    print(f"| the flow (tune, cluster='local', start included) | {flow_seconds:.1f} |")
    print(f"| engine alone, local mode, the trials the flow trained | {engine:.1f} |")
    print(f"| baseline: engine alone / {cores} cores | {floor:.1f} |")
    print(f"\nflow / baseline: {ratio:.2f}x (goal <= {GOAL:g}x: "
          f"{'met' if ratio <= GOAL else 'not met'})")
    _breakdown(trials)
    records.write("grid_throughput", goals={f"flow <= {GOAL:g}x the baseline": ratio <= GOAL},
                  figures={"flow_over_baseline": ratio, "flow_s": flow_seconds,
                           "engine_s": engine, "trials": len(trials),
                           "reused": len(trials) - len(trained)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
