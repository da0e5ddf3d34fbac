"""The validation stage: each cell's best configuration retrained on the grid's held-out
seeds (the same for every cell), in Optuna, MLflow and the report; a rerun trains nothing
again; an algorithm whose batch never grows is searched once per model (the fair baseline)."""

import json
import subprocess
import sys

import optuna
import pytest

from flows.tune import grid_of, tune
from tasks.figures import time_vs_network
from tasks.report import build_report, grid_rows
from tasks.validation import held_out_seeds, validation_rows
from tests.flows.test_tune import mlflow_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

GRID = dict(networks=[2, 4], algorithms=["geodamplr", "geodamp"], models=["mlp"], trials=2,
            epochs=3, target_accuracy=0.45, validation_seeds=3, grid_name="v")


def _studies(run_dir):
    storage = f"sqlite:///{run_dir}/optuna.db"
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=storage)
            for s in optuna.get_all_study_summaries(storage)}


def _report_json(run_dir):
    out = subprocess.run([sys.executable, "-m", "damptune", "report", "--run-dir", run_dir,
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_held_out_seeds_are_shared_and_never_the_search_seed():
    settings, _ = grid_of({"seed": 7, "validation_seeds": 5})
    seeds = held_out_seeds(settings)
    assert len(set(seeds)) == 5 and 7 not in seeds
    assert seeds == held_out_seeds(grid_of({"seed": 7, "validation_seeds": 5,
                                            "networks": [16]})[0])
    assert seeds != held_out_seeds(grid_of({"seed": 8, "validation_seeds": 5})[0])


def test_validation_retrains_each_best_on_the_same_held_out_seeds(tmp_path, scheduler):
    run_dir = str(tmp_path / "v")
    tune(run_dir=run_dir, cluster=scheduler, **GRID)
    studies = _studies(run_dir)
    # the fair baseline: geodamplr never grows the batch, so it is searched once (at n2)
    assert "v/n4/geodamplr/mlp" not in studies and "v/n2/geodamplr/mlp" in studies
    seeds = held_out_seeds(grid_of(GRID)[0])
    for cell in ("n2/geodamplr/mlp", "n2/geodamp/mlp", "n4/geodamp/mlp"):
        validation, search = studies[f"v/{cell}/validation"], studies[f"v/{cell}"]
        done = [t for t in validation.trials if t.state.name == "COMPLETE"]
        assert sorted(t.user_attrs["train_seed"] for t in done) == sorted(seeds)
        best = min((t for t in search.trials if t.state.name == "COMPLETE"),
                   key=lambda t: t.value)  # every search trial here reaches the target
        assert all(t.params == best.params for t in done), (cell, best.params)
    # the matched comparison: geodamp with the baseline's best factor and delay, every size
    baseline = min((t for t in studies["v/n2/geodamplr/mlp"].trials
                    if t.state.name == "COMPLETE"), key=lambda t: t.value)
    for network in (2, 4):
        done = [t for t in studies[f"v/n{network}/geodamp/mlp/matched"].trials
                if t.state.name == "COMPLETE"]
        assert sorted(t.user_attrs["train_seed"] for t in done) == sorted(seeds)
        assert all(t.params == baseline.params for t in done)
        assert {t.user_attrs["validates"] for t in done} == {
            f"n2/geodamplr/mlp#{baseline.number}"}
    client, runs = mlflow_runs(run_dir, "v")
    held_out = [r for r in runs if r.data.tags.get("damptune.stage") == "validation"
                and r.data.tags.get("damptune.kind") == "trial"]
    assert len(held_out) == 9
    assert {int(r.data.params["seed"]) for r in held_out} == set(seeds)
    matched = [r for r in runs if r.data.tags.get("damptune.stage") == "matched"
               and r.data.tags.get("damptune.kind") == "trial"]
    assert len(matched) == 6 and {r.data.params["algorithm"] for r in matched} == {"geodamp"}
    # a held-out training may run HELD_OUT_EPOCHS times the search's 3 epochs to the target
    search_runs = [r for r in runs if r.data.tags.get("damptune.stage") == "search"
                   and r.data.tags.get("damptune.kind") == "trial"]
    assert {float(r.data.params["epochs"]) for r in search_runs} == {3.0}
    assert {float(r.data.params["epochs"]) for r in held_out + matched} == {4.5}
    # a held-out seed's run has metrics and no plots; a complete search trial's has its plots
    assert all(r.data.metrics.get("objective") for r in held_out + matched)
    assert not [r for r in held_out + matched if client.list_artifacts(r.info.run_id, "plots")]
    searched = [r for r in runs if r.data.tags.get("damptune.stage") == "search"
                and r.data.tags.get("damptune.state") == "COMPLETE"]
    assert searched and all(client.list_artifacts(r.info.run_id, "plots") for r in searched)
    with open(f"{run_dir}/report/answer.json") as f:
        ranked = sorted(json.load(f), key=lambda r: (r["network"], r["rank"]))
    answer = {(r["network"], r["algorithm"]): r for r in ranked}
    for network in (2, 4):
        row = answer[(network, "geodamp-matched")]
        assert row["n_seeds"] == 3 and row["speedup"] > 0 and row["speedup_low"] is not None
        # the registry's best is the answer's first on the held-out seeds (a searched cell)
        first = next(r["algorithm"] for r in ranked if r["network"] == network
                     and not r["algorithm"].endswith("-matched"))
        version = client.get_model_version_by_alias(f"v-mlp-n{network}", "best")
        assert client.get_run(version.run_id).data.tags["damptune.cell"] == (
            "n2/geodamplr/mlp" if first == "geodamplr" else f"n{network}/{first}/mlp")

    # each held-out training records when its schedule first changed (None: it stopped
    # before); the answer counts the seeds where it had not
    for (network, algorithm), row in answer.items():
        stage = "matched" if algorithm.endswith("-matched") else "validation"
        cell = "n2/geodamplr" if algorithm == "geodamplr" else f"n{network}/geodamp"
        changed = [t.user_attrs["schedule_changed_epoch"] for t in studies[
            f"v/{cell}/mlp/{stage}"].trials if t.state.name == "COMPLETE"
            and t.params == row["params"]]
        assert len(changed) == 3 and row["unchanged_seeds"] == changed.count(None)
        delay = row["params"]["delay"]
        assert all(e is None or delay < e < delay + 0.5 for e in changed), (changed, delay)
        # and by how much the search trial it retrains missed the search's target (0: reached)
        cell_key, number = row["validates"].split("#")
        source = studies[f"v/{cell_key}"].trials[int(number)]
        assert row["search_shortfall"] == (
            max([0.0, *source.constraints.values()]) if source.state.name == "COMPLETE" else None)
    near = [r for r in ranked if (r["search_shortfall"] or 0) > 0 and r["reliable"]
            and not r["algorithm"].endswith("-matched")]
    with open(f"{run_dir}/report/report.md") as f:
        assert ("answers missed the search's target on its seed**" in f.read()) == bool(near)

    rows = _report_json(run_dir)
    by = {(r["network"], r["algorithm"]): r for r in rows}
    assert set(by) == {(2, "geodamplr"), (2, "geodamp"), (4, "geodamplr"), (4, "geodamp")}
    assert by[(4, "geodamplr")]["shared_from"] == "n2/geodamplr/mlp"
    for row in rows:
        assert row["validation_n_seeds"] == 3 and row["validation_mean"] > 0
        assert row["validation_ci"] is not None and isinstance(row["validation_tied_best"], bool)
    assert by[(4, "geodamplr")]["validation_speedup"] == pytest.approx(1.0)
    with open(f"{run_dir}/report/report.md") as f:
        assert "held-out seeds" in f.read()

    # a grid's first K held-out seeds answer as a grid of K would (bench/answer_stability.py
    # --held-out K): each cell's values on those seeds only, the same values
    storage = f"sqlite:///{run_dir}/optuna.db"
    full = {r["study"]: r for r in validation_rows(storage, grid_name="v")}
    assert len(full) == 5 and all(r["n_seeds"] == 3 for r in full.values())
    for r in validation_rows(storage, grid_name="v", first_seeds=2):
        assert r["n_seeds"] == 2 and r["retrained"] == 1, r
        assert r["values"] == {s: full[r["study"]]["values"][s] for s in seeds[:2]}, r

    counts = {name: len(s.trials) for name, s in studies.items()}
    tune(run_dir=run_dir, cluster=scheduler, **GRID)  # the rerun: nothing trained twice
    assert {name: len(s.trials) for name, s in _studies(run_dir).items()} == counts
    assert len(mlflow_runs(run_dir, "v")[1]) == len(runs)


def _sgd_grid(tmp_path, name, **over):
    """A one-cell grid (n2, ``sgd``, MLP, target 0.3) whose search study exists before it
    runs: (grid, run_dir, settings, search study, its distributions)."""
    from tasks.grid import Cell
    from tasks.search import distributions, open_study

    grid = dict(GRID, networks=[2], algorithms=["sgd"], target_accuracy=0.3, grid_name=name,
                **over)
    run_dir = tmp_path / name
    run_dir.mkdir()
    settings, _ = grid_of({**grid, "run_dir": str(run_dir)})
    cell = Cell(2, "sgd", "mlp")
    search = open_study(settings, cell, n_train=4000)
    return grid, str(run_dir), settings, search, distributions(settings, cell)


@pytest.mark.parametrize("pruner", ["none", "bound"])
def test_a_best_that_misses_on_the_held_out_seeds_gives_way_to_the_runner_up(tmp_path, scheduler,
                                                                               pruner):
    """The winner's curse in its plainest form: the search's best reached the target on its
    own seed only. Here its search's first trial is that lucky one, put into Optuna before the
    grid runs (lr 0.001 with a fast time: far too slow to reach the target in 3 epochs on
    any seed); its second is trained by the grid (lr 0.2, enqueued): COMPLETE without a
    pruner, PRUNED by the bound (the lucky time) with one. The best misses on every
    held-out seed, so the runner-up is retrained on the same seeds, answers for the cell, and
    is the model the registry calls best."""
    from tasks.search import TARGET_CONSTRAINT

    grid, run_dir, settings, search, space = _sgd_grid(tmp_path, "r", pruner=pruner)
    search.add_trial(optuna.trial.create_trial(
        params={"lr": 1e-3}, distributions=space, value=0.01,
        constraints={TARGET_CONSTRAINT: 0.0}))
    search.enqueue_trial({"lr": 0.2})
    tune(run_dir=run_dir, cluster=scheduler, **grid)

    studies = _studies(run_dir)
    second = studies["r/n2/sgd/mlp"].trials[1]
    assert second.params == {"lr": 0.2}
    assert second.state.name == ("COMPLETE" if pruner == "none" else "PRUNED")
    done = [t for t in studies["r/n2/sgd/mlp/validation"].trials if t.state.name == "COMPLETE"]
    seeds = sorted(held_out_seeds(settings))
    by = {}
    for t in done:
        by.setdefault(t.user_attrs["validates"], []).append(t)
    assert sorted(by) == ["n2/sgd/mlp#0", "n2/sgd/mlp#1"], sorted(by)
    for name, lr in (("n2/sgd/mlp#0", 1e-3), ("n2/sgd/mlp#1", 0.2)):
        assert sorted(t.user_attrs["train_seed"] for t in by[name]) == seeds
        assert {t.params["lr"] for t in by[name]} == {lr}
    assert not any(t.constraints[TARGET_CONSTRAINT] <= 0 for t in by["n2/sgd/mlp#0"])
    with open(f"{run_dir}/report/answer.json") as f:
        (row,) = json.load(f)
    assert row["params"] == {"lr": 0.2} and row["reliable"] and row["n_seeds"] == 3
    # sgd never changes its batch size or rate: every held-out training says so, and the
    # answer counts every seed (and, sgd having no schedule, does not say it in words)
    assert [t.user_attrs["schedule_changed_epoch"] for t in done] == [None] * 6
    assert row["unchanged_seeds"] == 3
    # the runner-up's search trial reached the search's target, or was pruned (not judged)
    assert row["search_shortfall"] == (
        max([0.0, *second.constraints.values()]) if pruner == "none" else None)
    (replaced,) = row["replaced"]
    assert {k: replaced[k] for k in ("validates", "n_seeds", "reached_seeds")} == {
        "validates": "n2/sgd/mlp#0", "n_seeds": 3, "reached_seeds": 0}
    with open(f"{run_dir}/report/report.md") as f:
        text = f.read()
    assert "replaces n2/sgd/mlp#0: the target on 0 of 3 seeds" in text
    assert "plain SGD" not in text
    # the headline figure draws the runner-up's held-out mean as a square, not a circle
    storage = f"sqlite:///{run_dir}/optuna.db"
    report = build_report(grid_rows(storage, grid_name="r"), run_dir=run_dir, storage=storage,
                          grid_name="r")
    held_out = [line for line in time_vs_network(report).axes[0].lines
                if line.get_markerfacecolor() == "white"]  # the error bars' points
    markers = {line.get_marker(): list(line.get_ydata()) for line in held_out}
    assert markers == {"s": [pytest.approx(row["mean"])]}, markers
    client, runs = mlflow_runs(run_dir, "r")
    assert len([r for r in runs if r.data.tags.get("damptune.stage") == "validation"
                and r.data.tags.get("damptune.kind") == "trial"]) == 6
    # the registry's best: the runner-up trained to the target on a held-out seed (its search
    # trial may have been pruned half-way), the fastest of them
    version = client.get_model_version_by_alias("r-mlp-n2", "best")
    trained = client.get_run(version.run_id)
    assert trained.data.tags["damptune.cell"] == "n2/sgd/mlp/validation"
    fastest = min((t for t in by["n2/sgd/mlp#1"] if t.constraints[TARGET_CONSTRAINT] <= 0),
                  key=lambda t: t.value)
    assert trained.data.tags["damptune.trial_number"] == str(fastest.number)

    tune(run_dir=run_dir, cluster=scheduler, **grid)  # the rerun: nothing trained twice
    assert len(_studies(run_dir)["r/n2/sgd/mlp/validation"].trials) == 6
    assert len(mlflow_runs(run_dir, "r")[1]) == len(runs)


def test_a_faster_near_miss_is_retrained_beside_the_best_and_answers_when_faster(
        tmp_path, scheduler, monkeypatch):
    """A configuration that stopped just short of the target on the search's seed, faster
    than the best, is retrained on the same held-out seeds, and answers when it reaches the
    target there in less time. The search is put into Optuna before the grid runs: its best
    (lr 0.04, reached, slow), a near miss (lr 0.1, 0.01 short, fast) and a far miss (lr 0.5,
    0.05 short, fastest), which is not retrained. The grid is first run as one seeded before
    near misses were retrained (``NEAR_MISS`` 0): its rerun retrains the near miss, and only
    it; a third run trains nothing."""
    from tasks import validation
    from tasks.search import TARGET_CONSTRAINT

    grid, run_dir, settings, search, space = _sgd_grid(tmp_path, "m", trials=3)
    for lr, value, short in ((0.04, 5.0, 0.0), (0.1, 0.5, 0.01), (0.5, 0.1, 0.05)):
        search.add_trial(optuna.trial.create_trial(
            params={"lr": lr}, distributions=space, value=value,
            constraints={TARGET_CONSTRAINT: short}))
    monkeypatch.setattr(validation, "NEAR_MISS", 0.0)
    tune(run_dir=run_dir, cluster=scheduler, **grid)
    first = _studies(run_dir)["m/n2/sgd/mlp/validation"].trials
    assert {t.user_attrs["validates"] for t in first} == {"n2/sgd/mlp#0"} and len(first) == 3
    monkeypatch.setattr(validation, "NEAR_MISS", 0.015)
    tune(run_dir=run_dir, cluster=scheduler, **grid)

    trials = _studies(run_dir)["m/n2/sgd/mlp/validation"].trials
    by = {}
    for t in trials:
        assert t.state.name == "COMPLETE"
        by.setdefault(t.user_attrs["validates"], []).append(t)
    assert sorted(by) == ["n2/sgd/mlp#0", "n2/sgd/mlp#1"], sorted(by)  # not the far miss
    assert [t.number for t in trials[:3]] == [t.number for t in first]  # none trained twice
    seeds = sorted(held_out_seeds(settings))
    means = {}
    for name, lr in (("n2/sgd/mlp#0", 0.04), ("n2/sgd/mlp#1", 0.1)):
        assert sorted(t.user_attrs["train_seed"] for t in by[name]) == seeds
        assert {t.params["lr"] for t in by[name]} == {lr}
        assert all(t.constraints[TARGET_CONSTRAINT] <= 0 for t in by[name]), name
        means[name] = sum(t.value for t in by[name]) / 3
    assert means["n2/sgd/mlp#1"] < means["n2/sgd/mlp#0"], means
    with open(f"{run_dir}/report/answer.json") as f:
        (row,) = json.load(f)
    assert row["params"] == {"lr": 0.1} and row["reliable"] and row["n_seeds"] == 3
    assert row["mean"] == pytest.approx(means["n2/sgd/mlp#1"])
    assert row["replaced"] == [{"validates": "n2/sgd/mlp#0", "n_seeds": 3, "reached_seeds": 3,
                                "mean": pytest.approx(means["n2/sgd/mlp#0"])}]
    # the answer says it is the search's near miss, and the report says what that means
    assert row["search_shortfall"] == pytest.approx(0.01)
    with open(f"{run_dir}/report/report.md") as f:
        text = f.read()
    assert ("**mlp: 1 of 1 answers missed the search's target on its seed** (n2 sgd): they ran "
            "out of the search's epochs 0.01 short of it") in text
    assert "a larger `epochs` for mlp" in text

    tune(run_dir=run_dir, cluster=scheduler, **grid)  # nothing trained twice
    assert len(_studies(run_dir)["m/n2/sgd/mlp/validation"].trials) == 6
