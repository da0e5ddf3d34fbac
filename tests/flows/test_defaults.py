"""One set of defaults: the flow's parameters, the grid's settings and `damptune tune`."""

import dataclasses
import importlib
import os
import re
import subprocess
import sys

from damptune import interrupt
from damptune.cli import main
from flows.cli import _TUNE_OPTIONS
from flows.tune import flow_defaults, grid_of
from tasks.grid import GridSettings, shared_across_networks


def test_flow_defaults_equal_the_grid_settings_defaults():
    flow = flow_defaults()
    settings = GridSettings()
    shared = {f.name for f in dataclasses.fields(GridSettings)} & set(flow)
    assert {"trials", "epochs", "target_accuracy", "sampler", "pruner", "mode",
            "warm_start", "eval_resolution"} <= shared
    for name in shared - {"run_dir", "storage", "tracking_uri", "checkpoint_root",
                          "max_cluster_lifetime", "data_root",
                          "workers_per_trial"}:
        assert getattr(settings, name) == flow[name], name


def test_every_tune_option_is_a_flow_parameter_and_the_defaults_validate():
    flow = flow_defaults()
    assert all(dest in flow for _, dest, _, _ in _TUNE_OPTIONS)
    settings, cells = grid_of({})
    shared = [a for a in flow["algorithms"] if shared_across_networks(a, settings)]
    assert shared == ["geodamplr", "cntsdamplr"]  # searched once per model (fair baseline)
    assert len(cells) == (len(flow["networks"]) * (len(flow["algorithms"]) - len(shared))
                          + len(shared)) * len(flow["models"])
    assert settings.storage.startswith("sqlite:///")


def test_default_run_dir_follows_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not where the package lies: an installed one is elsewhere
    settings, _ = grid_of({"grid_name": "g"})
    assert settings.run_dir == str(tmp_path / "runs" / "g")
    assert settings.storage == f"sqlite:///{tmp_path}/runs/g/optuna.db"
    assert grid_of({"run_dir": "mine"})[0].run_dir == str(tmp_path / "mine")
    assert grid_of({"run_dir": "/elsewhere/g"})[0].run_dir == "/elsewhere/g"


def test_cli_tune_from_a_directory_runs_the_grid_there(tmp_path, monkeypatch):
    """`damptune tune` run from ``tmp_path`` gives the flow a run directory under it (the
    flow itself, minutes of training, is replaced by a recorder)."""
    module, calls = importlib.import_module("flows.tune"), []

    def recorder(**params):
        calls.append(params)
        return []

    recorder.fn = module.tune.fn  # the flow's signature: its defaults
    monkeypatch.setattr(module, "tune", recorder)
    monkeypatch.setattr(interrupt, "install_sigterm_handler", lambda **_: True)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--networks", "2", "--algorithms", "geodamp", "--models", "mlp",
                 "--trials", "1", "--grid-name", "tiny", "--no-progress"]) == 0
    assert calls[0]["run_dir"] == str(tmp_path / "runs" / "tiny")
    assert calls[0]["storage"] == f"sqlite:///{tmp_path}/runs/tiny/optuna.db"


def test_cli_tune_help_prints_the_flow_defaults_once():
    """`damptune tune --help` shows, for each option, the default its flow parameter really
    has (the flow's signature), written as the option takes it, and never twice."""
    out = subprocess.run([sys.executable, "-m", "damptune", "tune", "--help"], check=True,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "2000"}).stdout  # a help a line
    helps = dict(re.findall(r"^  (--[\w-]+) [A-Z_]+\s+(.*)$", out, re.MULTILINE))
    flow = flow_defaults()
    expected = {
        "--trials": str(flow["trials"]),
        "--networks": ",".join(str(n) for n in flow["networks"]),
        "--models": ",".join(flow["models"]),
        "--epochs": ",".join(f"{m}={e:g}" for m, e in flow["epochs"].items()),
        "--target": ",".join(f"{m}={a:g}" for m, a in flow["target_accuracy"].items()),
        "--profile": flow["profile"],
        "--checkpoint-seconds": f"{flow['checkpoint_seconds']:g}",
        "--concurrent-cells": str(flow["max_concurrent_cells"]),
        "--validation-seeds": str(flow["validation_seeds"]),
        "--max-cluster-lifetime": "none" if flow["max_cluster_lifetime"] is None else "?",
    }
    assert expected["--epochs"].startswith("mlp=12,cnn=10")
    for flag, value in expected.items():
        assert helps[flag].endswith(f"(default: {value})"), (flag, helps[flag])
    assert "the flow's" not in out
    assert sorted(helps) == sorted(flag for flag, _, _, _ in _TUNE_OPTIONS)
    for flag in helps:  # one default each (a None one: "none", or what None means)
        assert helps[flag].count("default") == 1, (flag, helps[flag])
