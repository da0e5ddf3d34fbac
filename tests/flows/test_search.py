"""The search itself, through the real flow (Prefect harness, Optuna and MLflow on SQLite):
pruning happens and never prunes a trial that could have won; GP and successive halving run."""

import optuna
import pytest

from damptune import TrainData, train
from flows.tune import tune
from models import load_dataset
from tasks.grid import Cell, GridSettings
from tasks.objective import objective
from tasks.trial import trial_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

SMALL = dict(networks=[4], models=["mlp"], epochs=4, target_accuracy=0.5, mode="local",
             cluster="local", warm_start=False, validation_seeds=0)


def trials(run_dir, name):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{run_dir}/optuna.db").trials


def test_bound_pruning_happens_and_no_pruned_trial_could_have_won(tmp_path):
    run_dir = str(tmp_path / "p")
    tune(algorithms=["padadamp"], trials=8, grid_name="p", run_dir=run_dir, **SMALL)
    done = trials(run_dir, "p/n4/padadamp/mlp")
    pruned = [t for t in done if t.state == optuna.trial.TrialState.PRUNED]
    complete = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    assert pruned and complete, [t.state for t in done]
    reached = [t for t in complete if t.constraints["target_shortfall"] <= 0]
    best = min(t.value for t in reached)  # a trial that missed the target bounds nothing
    # each pruned configuration, replayed to its end without a bound, is no better than the best
    settings = GridSettings(epochs=4, target_accuracy=0.5, mode="local")
    cell = Cell(4, "padadamp", "mlp")
    # what the search's trials are timed to: the model's target plus the search margin (a
    # pruned trial may touch 0.5 before the best did, and still reach 0.51 after it)
    target = settings.target_of(cell)
    assert target > 0.5
    ds = load_dataset("mnist1d", seed=0)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    study = optuna.load_study(study_name="p/n4/padadamp/mlp",
                              storage=f"sqlite:///{run_dir}/optuna.db")
    calibration = study.user_attrs["compute_calibration"]
    for t in pruned:
        config = trial_config(settings, cell, t.params, ds)
        for key, value in calibration.items():
            setattr(config, key, value)
        state = train(config, data)
        value, hit, _ = objective(state.history, target=target)
        assert not hit or value >= best, (t.number, t.params, value, best)
        # where it was stopped, its simulated time had reached the best value then
        stop = max(t.intermediate_values)
        at_stop = [r for r in state.history if r["examples_seen"] == stop]
        assert at_stop and at_stop[-1]["time_sim"] >= min(
            u.value for u in reached if u.number < t.number)
    # no configuration asked twice (a deterministic trial repeated repeats its result)
    assert len({t.params["rate"] for t in done}) == len(done)


def test_gp_sampler_and_successive_halving_run_and_report(tmp_path):
    run_dir = str(tmp_path / "g")
    rows = tune(algorithms=["geodamp"], trials=6, sampler="gp", pruner="sha", grid_name="g",
                run_dir=run_dir, **SMALL)
    assert rows[0]["n_failed"] == 0 and rows[0]["n_complete"] >= 1
    done = trials(run_dir, "g/n4/geodamp/mlp")
    assert len(done) == 6 and all(t.state.is_finished() for t in done)
    assert len({(t.params["factor"], t.params["delay"]) for t in done}) == 6  # all different
    # the multi-fidelity pruner was fed the objective so far, at examples seen
    reported = [t for t in done if t.intermediate_values]
    assert reported
    for t in reported:  # about one report per epoch (4000 examples), at most the budget's
        steps = sorted(t.intermediate_values)
        regular = steps[:-1] if t.state == optuna.trial.TrialState.PRUNED else steps
        assert len(steps) <= 5 and all(
            b - a >= 3000 for a, b in zip(regular, regular[1:], strict=False))


def test_a_grid_searched_with_a_linear_delay_reruns_on_its_own_scale(tmp_path, monkeypatch):
    """`geodamp`'s `delay` is searched on a log scale; a grid an earlier damptune searched on
    the linear one (Optuna refuses a parameter another scale within a study) reruns to more
    trials on the scale its study recorded, keeping every trial it had. A new grid gets the
    log scale."""
    from damptune import Param
    from damptune.dampers import GeoDamp

    run_dir, name = str(tmp_path / "old"), "old/n4/geodamp/mlp"
    linear = tuple(Param(p.name, p.low, p.high, False, p.integer, p.unit, p.doc)
                   if p.name == "delay" else p for p in GeoDamp.search_space)
    with monkeypatch.context() as m:  # the space as it was
        m.setattr(GeoDamp, "search_space", linear)
        tune(algorithms=["geodamp"], trials=2, grid_name="old", run_dir=run_dir, **SMALL)
    before = [(t.number, t.state, t.params, t.value) for t in trials(run_dir, name)]
    assert len(before) == 2 and not trials(run_dir, name)[0].distributions["delay"].log

    tune(algorithms=["geodamp"], trials=4, grid_name="old", run_dir=run_dir, **SMALL)
    after = trials(run_dir, name)
    assert [(t.number, t.state, t.params, t.value) for t in after[:2]] == before
    assert len(after) == 4 and all(t.state.is_finished() for t in after)
    assert [t.distributions["delay"].log for t in after] == [False] * 4

    tune(algorithms=["geodamp"], trials=2, grid_name="new", run_dir=str(tmp_path / "new"),
         **SMALL)
    assert all(t.distributions["delay"].log for t in trials(str(tmp_path / "new"),
                                                             "new/n4/geodamp/mlp"))
