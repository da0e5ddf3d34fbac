"""``damptune report`` as a user runs it: a subprocess over a real grid's run directory
(Optuna studies and trial checkpoints from short local-mode runs, tests/tasks/report_grids.py)."""

import json
import os
import subprocess
import sys

import optuna
import pytest

from tasks.figures import FIGURES
from tasks.grid import Cell, checkpoint_path
from tests.tasks.report_grids import build_grid, settings_for

pytestmark = pytest.mark.slow  # 4 short training runs, then the command (imports ~5 s)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    settings = settings_for(str(tmp_path_factory.mktemp("cli") / "runs" / "g"), grid_name="g")
    return build_grid(settings, networks=(2, 4), algorithms=("geodamplr", "geodamp"),
                      trials={"geodamplr": [{"factor": 2.0, "delay": 1}],
                              "geodamp": [{"factor": 4.0, "delay": 1}]})


def report(*args):
    return subprocess.run([sys.executable, "-m", "damptune", "report", *args],
                          capture_output=True, text=True, timeout=300)


def test_report_json_is_one_ranked_object_per_algorithm_per_pair(grid):
    out = report("--run-dir", grid.run_dir, "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["network"], r["model"], r["rank"]) for r in rows] == [
        (2, "mlp", 1), (2, "mlp", 2), (4, "mlp", 1), (4, "mlp", 2)]
    for r in rows:
        assert r["grid"] == "g" and r["study"] == f"g/n{r['network']}/{r['algorithm']}/mlp"
        assert r["n_complete"] == 1 and r["n_failed"] == r["n_interrupted"] == 0
        assert r["best_trial"] == 0 and r["reached"] is True and r["updates_to_target"] > 0
        base = next(b for b in rows if b["network"] == r["network"]
                    and b["algorithm"] == "geodamplr")
        assert r["speedup_vs_geodamplr"] == pytest.approx(base["best_value"] / r["best_value"])
    for network in (2, 4):  # ranked by best value
        values = [r["best_value"] for r in rows if r["network"] == network]
        assert values == sorted(values)
    figures = set(os.listdir(os.path.join(grid.run_dir, "report")))
    assert set(FIGURES) | {"report.md", "report.json", "profiles.csv"} <= figures


def test_report_prints_the_ranking_and_writes_to_out(grid, tmp_path):
    out = report("--run-dir", grid.run_dir, "--out", str(tmp_path / "elsewhere"))
    assert out.returncode == 0, out.stderr[-2000:]
    # the search's ranking: its trials trained to the target plus the default search margin
    assert "mlp on 4 ranks (search target 0.46):" in out.stdout
    assert "geodamplr" in out.stdout and "1.00x" in out.stdout  # the baseline against itself
    assert "counts c/p/f/i" in out.stdout and "1/0/0/0" in out.stdout
    assert (tmp_path / "elsewhere" / "time_vs_network.png").stat().st_size > 20_000


def test_report_without_a_checkpoint_says_history_unavailable(grid, tmp_path):
    path = checkpoint_path(grid, Cell(4, "geodamp", "mlp"), 0)
    os.replace(path, tmp_path / "moved.pt")
    try:
        out = report("--run-dir", grid.run_dir, "--json", "--out", str(tmp_path / "r"))
    finally:
        os.replace(tmp_path / "moved.pt", path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {(r["network"], r["algorithm"]): r for r in map(json.loads, out.stdout.splitlines())}
    assert rows[(4, "geodamp")]["history"].startswith("history unavailable: checkpoint_path=")
    assert rows[(4, "geodamp")]["reached"] is True and rows[(4, "geodamp")]["rank"] in (1, 2)
    assert rows[(2, "geodamp")]["history"] == "ok"


def test_report_on_a_run_dir_without_studies_names_it(tmp_path):
    out = report("--run-dir", str(tmp_path / "nothing"))
    assert out.returncode == 2
    assert "--run-dir=" in out.stderr and "nothing" in out.stderr
    assert "holding optuna.db" in out.stderr
    (tmp_path / "empty").mkdir()
    optuna.create_study(storage=f"sqlite:///{tmp_path}/empty/optuna.db", study_name="x")
    out = report("--run-dir", str(tmp_path / "empty"), "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert "found none" in out.stderr and "damptune tune" in out.stderr


def test_report_reads_checkpoints_from_the_grid_checkpoint_root(tmp_path):
    """A grid whose checkpoints are elsewhere (``checkpoint_root``, kept in grid.json) is
    reported with its histories; ``--checkpoint-root`` overrides it."""
    settings = settings_for(str(tmp_path / "g2"), grid_name="g2",
                            checkpoint_root=str(tmp_path / "ckpts"))
    build_grid(settings, networks=(2,), algorithms=("geodamp",),
               trials={"geodamp": [{"factor": 4.0, "delay": 1}]})
    assert os.path.exists(tmp_path / "ckpts" / "g2" / "checkpoints" / "n2" / "geodamp" / "mlp")
    (row,) = map(json.loads, report("--run-dir", settings.run_dir, "--json").stdout.splitlines())
    assert row["history"] == "ok" and row["reached"] is True
    out = report("--run-dir", settings.run_dir, "--json", "--checkpoint-root", str(tmp_path))
    assert json.loads(out.stdout)["history"].startswith("history unavailable")
