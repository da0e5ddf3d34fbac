"""``make run``'s progress line counts what the grid's Optuna storage holds: finished trials
per cell of this grid only, cells done once they have their trials, the held-out stage apart."""

import io
import threading

import optuna
from rich.console import Console

from infra.progress import GridWatch, expected_cells
from tasks.grid import Cell
from tasks.search import storage_for


def _study(url: str, grid: str, key: str, states: list[str]) -> None:
    study = optuna.create_study(study_name=f"{grid}/{key}", storage=storage_for(url))
    study.set_user_attr("grid", grid)
    for state in states:
        trial = study.ask()
        if state == "COMPLETE":
            study.tell(trial, 1.0)
        elif state == "PRUNED":
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        # else RUNNING: asked, never told


def test_progress_counts_finished_trials_per_cell_of_its_grid_only(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    _study(url, "g", "n2/geodamp/mlp", ["COMPLETE", "PRUNED"])
    _study(url, "g", "n2/padadamp/mlp", ["COMPLETE", "RUNNING"])
    _study(url, "g", "n2/geodamp/mlp/validation", ["COMPLETE", "COMPLETE", "COMPLETE"])
    _study(url, "other", "n2/padadamp/mlp", ["COMPLETE", "COMPLETE"])
    expected = [(Cell(2, "geodamp", "mlp"), 2), (Cell(2, "padadamp", "mlp"), 2),
                (Cell(2, "geodamp", "mlp", "validation"), 2),
                (Cell(2, "padadamp", "mlp", "validation"), 2)]
    p = GridWatch(url, "g", expected).look()
    assert (p.cells, p.cells_done, p.trials, p.trials_done) == (4, 2, 8, 5), p
    assert (p.held_out_cells, p.held_out_done) == (2, 1), p
    assert p.line() == "cells 2/4 · trials 5/8 · held-out cells 1/2"


def test_progress_waits_for_the_storage_and_never_creates_it(tmp_path):
    url = f"sqlite:///{tmp_path}/runs/g/optuna.db"
    assert GridWatch(url, "g", [(Cell(2, "geodamp", "mlp"), 2)]).look() is None
    assert not (tmp_path / "runs").exists()


def test_progress_expects_the_flow_runs_grid(tmp_path):
    """The smoke deployment's grid: two search cells of 2 trials, their selection cells (at
    most 2 candidates, the search's trials, on 2 selection seeds) and estimation cells of 2
    seeds; the storage under the deployment's working directory."""
    storage, grid, expected = expected_cells(
        {"networks": [2], "algorithms": ["geodamp", "padadamp"], "models": ["mlp"],
         "trials": 2, "epochs": 2, "validation_seeds": 2, "grid_name": "smoke"}, tmp_path)
    assert storage == f"sqlite:///{tmp_path}/runs/smoke/optuna.db" and grid == "smoke"
    assert [(c.key, n) for c, n in expected] == [
        ("n2/geodamp/mlp", 2), ("n2/padadamp/mlp", 2), ("n2/geodamp/mlp/selection", 4),
        ("n2/padadamp/mlp/selection", 4), ("n2/geodamp/mlp/validation", 2),
        ("n2/padadamp/mlp/validation", 2)]


def test_progress_prints_a_line_where_the_output_is_no_terminal(tmp_path, monkeypatch):
    """In a log (no terminal) the watch prints a plain line when the counts change, with the
    time elapsed and an estimate of the time left, until stopped."""
    import infra.progress as progress

    monkeypatch.setattr(progress, "LOOK_S", 0.05)
    url = f"sqlite:///{tmp_path}/optuna.db"
    _study(url, "g", "n2/geodamp/mlp", ["COMPLETE"])
    out = io.StringIO()
    printed = threading.Event()

    class Spy(io.StringIO):
        def write(self, text):
            printed.set()
            return out.write(text)

    console = Console(file=Spy(), force_terminal=False, width=40)  # a narrow log
    with GridWatch(url, "g", [(Cell(2, "geodamp", "mlp"), 4)], console=console):
        assert printed.wait(10), "no progress line within 10 s"
    assert "grid g: cells 0/1 · trials 1/4 · 0:00 elapsed · about 0:00 left\n" in out.getvalue()
