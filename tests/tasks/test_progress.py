"""The progress count of ``damptune tune``: finished trials of one grid, from the storage."""

import optuna

from tasks.search import finished_in_grid


def _study(url: str, name: str, grid: str | None, states: list[str]) -> None:
    study = optuna.create_study(storage=url, study_name=name)
    if grid is not None:
        study.set_user_attr("grid", grid)
    for state in states:
        trial = study.ask()
        trial.report(0.5, step=1)  # reports are not trials
        if state == "COMPLETE":
            study.tell(trial, 1.0)
        elif state == "PRUNED":
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif state == "FAIL":
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        # RUNNING: left as it is


def test_finished_in_grid_counts_the_grids_finished_trials_only(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path}/optuna.db"
    _study(url, "g/n2/geodamp/mlp", "g", ["COMPLETE", "PRUNED", "FAIL", "RUNNING"])
    _study(url, "g/n2/geodamp/mlp/validation", "g", ["COMPLETE", "COMPLETE"])
    _study(url, "g2/n2/geodamp/mlp", "g2", ["COMPLETE", "PRUNED"])  # another grid
    _study(url, "loose", None, ["COMPLETE"])  # no grid
    assert finished_in_grid(url, "g") == 5
    assert finished_in_grid(url, "g2") == 2
    assert finished_in_grid(url, "none") == 0
    # the same as Optuna's own count
    storage = optuna.storages.RDBStorage(url)
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                optuna.trial.TrialState.FAIL)
    assert finished_in_grid(url, "g") == sum(
        storage.get_n_trials(s._study_id, finished) for s in storage.get_all_studies()
        if s.user_attrs.get("grid") == "g")
