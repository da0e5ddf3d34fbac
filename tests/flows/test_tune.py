"""The tune flow on tiny grids, with real Prefect (test harness), Optuna on SQLite, MLflow on
SQLite and real Dask clusters."""

import json
import os
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from damptune import ConfigError
from flows.tune import tune
from tasks.figures import FIGURES
from tasks.grid import GridSettings
from tasks.report import read_meta

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

TINY = dict(networks=[2], algorithms=["geodamp"], models=["mlp"], epochs=2,
            target_accuracy=0.3, pruner="none", validation_seeds=0)


def mlflow_runs(run_dir, grid_name):
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    exp = client.get_experiment_by_name(f"damptune-{grid_name}")
    return client, client.search_runs([exp.experiment_id], max_results=1000)


def test_tune_tiny_grid_records_study_runs_and_summary(tmp_path):
    run_dir, ckpts = str(tmp_path / "g"), str(tmp_path / "ckpts")  # checkpoints elsewhere
    rows = tune(trials=2, grid_name="tiny", run_dir=run_dir, cluster="local",
                checkpoint_root=ckpts, **TINY)
    assert len(rows) == 1 and rows[0]["n_complete"] == 2 and rows[0]["best_value"] > 0
    study = optuna.load_study(study_name="tiny/n2/geodamp/mlp",
                              storage=f"sqlite:///{run_dir}/optuna.db")
    assert len(study.trials) == 2
    assert {"factor", "delay"} == set(study.best_params)

    client, runs = mlflow_runs(run_dir, "tiny")
    parents = [r for r in runs if r.data.tags.get("damptune.kind") == "cell"]
    children = [r for r in runs if r.data.tags.get("damptune.kind") == "trial"]
    assert len(parents) == 1 and len(children) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    child = children[0]
    for key in ("algorithm", "network", "model", "dataset", "seed", "mode", "profile",
                "hp.factor", "hp.delay"):
        assert key in child.data.params
    steps = {m.step for m in client.get_metric_history(child.info.run_id, "batch_size")}
    every = GridSettings().metrics_every  # step metrics: a series, every N updates
    assert steps >= set(range(every, int(child.data.metrics["updates"]) + 1, every)) != set()
    for key in ("loss", "test_accuracy", "lr", "n_workers", "examples_seen", "time_sim",
                "objective", "best_accuracy"):
        assert key in child.data.metrics
    artifacts = {a.path for a in client.list_artifacts(child.info.run_id, "plots")}
    assert artifacts == {"plots/schedule.png", "plots/accuracy_vs_time.png"}
    assert parents[0].data.tags["damptune.best_trial"] == str(rows[0]["best_trial"])
    assert os.path.exists(f"{run_dir}/summary.csv") and os.path.exists(f"{run_dir}/summary.md")
    # the report: ranking and figures in the run directory, on the summary run, in Prefect
    report = json.loads(Path(f"{run_dir}/report/report.json").read_text())
    assert [(r["algorithm"], r["rank"], r["best_value"], r["history"]) for r in report] == [
        ("geodamp", 1, rows[0]["best_value"], "ok")]  # its history read from checkpoint_root
    assert read_meta(run_dir)["checkpoint_root"] == ckpts  # for `damptune report`
    summary = next(r for r in runs if r.data.tags.get("damptune.kind") == "grid")
    logged = {a.path for a in client.list_artifacts(summary.info.run_id, "report")}
    assert {f"report/{name}" for name in FIGURES} | {"report/report.md"} <= logged
    for name in FIGURES:
        assert os.path.getsize(f"{run_dir}/report/{name}") > 20_000
    with get_client(sync_client=True) as prefect:
        keys = {a.key for a in prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(like_="report-tiny")))}
    assert keys == {"report-tiny", *(f"report-tiny-{n.removesuffix('.png').replace('_', '-')}"
                                     for n in FIGURES)}

    # a rerun tops the study up to the new total, and never beyond it
    tune(trials=3, grid_name="tiny", run_dir=run_dir, cluster="local", checkpoint_root=ckpts,
         **TINY)
    tune(trials=2, grid_name="tiny", run_dir=run_dir, cluster="local", checkpoint_root=ckpts,
         **TINY)
    assert len(optuna.load_study(study_name="tiny/n2/geodamp/mlp",
                                 storage=f"sqlite:///{run_dir}/optuna.db").trials) == 3
    _, runs = mlflow_runs(run_dir, "tiny")
    assert sum(r.data.tags.get("damptune.kind") == "cell" for r in runs) == 1
    assert sum(r.data.tags.get("damptune.kind") == "trial" for r in runs) == 3


def test_tune_without_deadlock_under_tight_thread_limits(tmp_path, scheduler, monkeypatch):
    """More cells x trials than threads: cells wait on trials in their own pools."""
    monkeypatch.setenv("PREFECT_TASK_RUNNER_THREAD_POOL_MAX_WORKERS", "1")
    rows = tune(networks=[1, 2], algorithms=["geodamp", "padadamp"], models=["mlp"], trials=2,
                epochs=1, target_accuracy=0.2, pruner="none", grid_name="tight",
                run_dir=str(tmp_path / "t"), cluster=scheduler, max_concurrent_cells=3,
                max_concurrent_trials=2, validation_seeds=0)
    assert len(rows) == 4 and all(r["n_complete"] == 2 for r in rows)


def test_trials_per_model_give_each_models_cells_their_own_search_budget(tmp_path):
    """``trials={"mlp": 3, "cnn": 1}``: every MLP search cell asks 3 trials, every CNN one 1;
    each selection cell waits for its own search's total, then retrains its candidates (at
    most the search's trials) on the 2 selection seeds, and the estimation cell the choice on
    the held-out seeds; the cells' MLflow runs record their model's total."""
    run_dir = str(tmp_path / "pm")
    tune(trials={"mlp": 3, "cnn": 1}, networks=[2], algorithms=["geodamp"],
         models=["mlp", "cnn"], epochs=2, target_accuracy=0.3, pruner="none",
         validation_seeds=2, grid_name="pm", run_dir=run_dir, cluster="local", mode="local")
    storage = f"sqlite:///{run_dir}/optuna.db"
    finished = {s.study_name: sum(t.state.is_finished() for t in optuna.load_study(
        study_name=s.study_name, storage=storage).trials)
        for s in optuna.get_all_study_summaries(storage)}
    assert finished == {"pm/n2/geodamp/mlp": 3, "pm/n2/geodamp/cnn": 1,
                        "pm/n2/geodamp/mlp/selection": 6, "pm/n2/geodamp/cnn/selection": 2,
                        "pm/n2/geodamp/mlp/validation": 2, "pm/n2/geodamp/cnn/validation": 2}
    _, runs = mlflow_runs(run_dir, "pm")
    cells = {r.data.tags["damptune.cell"]: r.data.params["trials"] for r in runs
             if r.data.tags.get("damptune.kind") == "cell"}
    assert cells == {"n2/geodamp/mlp": "3", "n2/geodamp/cnn": "1",
                     "n2/geodamp/mlp/selection": "2", "n2/geodamp/cnn/selection": "2",
                     "n2/geodamp/mlp/validation": "2", "n2/geodamp/cnn/validation": "2"}


def test_search_margin_raises_the_searchs_target_and_not_the_held_out_seeds(tmp_path):
    """``search_margin=0.1`` on a target of 0.3: the search's trials train until 0.4 (Optuna's
    study and MLflow's runs say so, and each that reached it has 0.4 as its best accuracy);
    the best configuration's held-out seeds stop at the target itself."""
    run_dir = str(tmp_path / "sm")
    tune(trials=2, networks=[2], algorithms=["geodamp"], models=["mlp"], epochs=3,
         target_accuracy=0.3, search_margin=0.1, pruner="none", validation_seeds=2,
         grid_name="sm", run_dir=run_dir, cluster="local", mode="local")
    storage = f"sqlite:///{run_dir}/optuna.db"
    targets = {s.study_name: s.user_attrs["target_accuracy"]
               for s in optuna.get_all_study_summaries(storage)}
    assert targets == {"sm/n2/geodamp/mlp": pytest.approx(0.4),
                       "sm/n2/geodamp/mlp/selection": 0.3,
                       "sm/n2/geodamp/mlp/validation": 0.3}
    _, runs = mlflow_runs(run_dir, "sm")
    trials = [r for r in runs if r.data.tags.get("damptune.kind") == "trial"]
    by_stage = {}
    for r in trials:
        by_stage.setdefault(r.data.params["stage"], []).append(r)
    assert len(by_stage["search"]) == len(by_stage["validation"]) == 2
    assert len(by_stage["selection"]) in (2, 4)  # 1 or 2 distinct candidates, 2 seeds each
    search, held_out = by_stage["search"], by_stage["validation"] + by_stage["selection"]
    assert {r.data.params["target_accuracy"] for r in search} == {"0.4"}
    assert {r.data.params["target_accuracy"] for r in held_out} == {"0.3"}
    reached = [r for r in search if r.data.metrics["reached_target"] == 1]
    assert reached and all(r.data.metrics["best_accuracy"] >= 0.4 for r in reached)
    # a held-out seed stops at its first evaluation at 0.3 or more, not at 0.4
    assert all(0.3 <= r.data.metrics["best_accuracy"] < 0.4 for r in held_out)


def test_tune_on_existing_scheduler_address(tmp_path, external_scheduler):
    rows = tune(trials=1, grid_name="addr", run_dir=str(tmp_path / "a"),
                cluster=external_scheduler, mode="decentralized", **TINY)
    assert rows[0]["n_complete"] == 1


def test_tune_refuses_bad_parameters_before_any_work(tmp_path):
    run_dir = tmp_path / "bad"
    with pytest.raises(ConfigError, match="algorithms='nope'"):
        tune(networks=[2], algorithms=["nope"], models=["mlp"], run_dir=str(run_dir))
    with pytest.raises(ConfigError, match="trials=0"):
        tune(networks=[2], algorithms=["geodamp"], models=["mlp"], trials=0,
             run_dir=str(run_dir))
    for name in ("seed", "data_seed"):
        with pytest.raises(ConfigError, match=rf"{name}=-1 is not accepted; expected an int"):
            tune(networks=[2], algorithms=["geodamp"], models=["mlp"], run_dir=str(run_dir),
                 **{name: -1})
    assert not run_dir.exists()


def test_warm_start_seeds_a_cell_with_its_finished_neighbours_best_deterministically(
        tmp_path, scheduler):
    """The n4 cell starts only once n2 finished, with n2's best configuration enqueued first
    (recorded in Optuna and MLflow); a second run of the same grid asks the same trials."""
    from tests.flows.grids import trials_of

    grid = dict(networks=[2, 4], algorithms=["padadamp"], models=["mlp"], epochs=3, trials=3,
                target_accuracy=0.45, grid_name="w", cluster=scheduler, validation_seeds=0)
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    tune(run_dir=first, **grid)
    storage = f"sqlite:///{first}/optuna.db"
    n2 = optuna.load_study(study_name="w/n2/padadamp/mlp", storage=storage)
    n4 = optuna.load_study(study_name="w/n4/padadamp/mlp", storage=storage)
    seeded = n4.trials[0]
    assert seeded.user_attrs["seeded_from"] == f"n2/padadamp/mlp#{n2.best_trial.number}"
    assert seeded.params == n2.best_params
    assert all("seeded_from" not in t.user_attrs for t in n2.trials + n4.trials[1:])
    _, runs = mlflow_runs(first, "w")
    tags = [r.data.tags for r in runs if r.data.tags.get("damptune.cell") == "n4/padadamp/mlp"
            and r.data.tags.get("damptune.kind") == "trial"]
    assert sorted(t.get("damptune.seeded_from", "") for t in tags) == [
        "", "", seeded.user_attrs["seeded_from"]]
    tune(run_dir=second, **grid)
    assert trials_of(second, "w") == trials_of(first, "w")


def _trial_runs(run_dir, grid_name):
    _, runs = mlflow_runs(run_dir, grid_name)
    return [r for r in runs if r.data.tags.get("damptune.kind") == "trial"]


def test_data_seed_fixes_the_data_while_the_seed_varies_training(tmp_path):
    """``seed`` varies the training and the search, ``data_seed`` the generated dataset: two
    seeds train on the same data (its digest in MLflow). A rerun of a grid on other data, or
    another grid in its run directory, is refused before any work, its study left as it was.
    Grids that share a ``checkpoint_root`` keep their checkpoints apart: none resumes another's
    trial 0 (which would fail it, or copy its value)."""
    values, digests, shared = {}, {}, tmp_path / "ckpts"
    for name, seed, data_seed in (("a", 0, 0), ("b", 1, 0), ("c", 0, 1)):
        run_dir = str(tmp_path / name)
        rows = tune(trials=1, grid_name=name, run_dir=run_dir, cluster="local", mode="local",
                    seed=seed, data_seed=data_seed, checkpoint_root=str(shared), **TINY)
        assert rows[0]["n_complete"] == 1 and rows[0]["n_failed"] == 0
        assert (shared / name / "checkpoints" / "n2" / "geodamp" / "mlp" / "trial-0.pt").exists()
        values[name] = rows[0]["best_value"]
        [run] = _trial_runs(run_dir, name)
        assert run.data.params["data_seed"] == str(data_seed)
        assert run.data.params["seed"] == str(seed)
        digests[name] = run.data.params["data_digest"]
    assert digests["a"] == digests["b"] != digests["c"]
    assert len(set(values.values())) == 3  # the seed still changes the training

    run_dir = str(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"data_seed=1 is not accepted; expected 0, the "
                                          r"data_seed of study 'a/n2/geodamp/mlp'"):
        tune(trials=2, grid_name="a", run_dir=run_dir, cluster="local", mode="local",
             data_seed=1, **TINY)
    with pytest.raises(ConfigError, match=r"grid_name='d' is not accepted; expected 'a', the "
                                          r"grid whose run_dir is"):
        tune(trials=2, grid_name="d", run_dir=run_dir, cluster="local", mode="local", **TINY)
    assert read_meta(run_dir)["grid_name"] == "a"
    study = optuna.load_study(study_name="a/n2/geodamp/mlp",
                              storage=f"sqlite:///{run_dir}/optuna.db")
    assert [t.value for t in study.trials] == [values["a"]]
    assert len(_trial_runs(run_dir, "a")) == 1
    assert optuna.get_all_study_names(f"sqlite:///{run_dir}/optuna.db") == ["a/n2/geodamp/mlp"]
