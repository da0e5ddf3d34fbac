"""One set of defaults: the flow's parameters, the grid's settings and `damptune tune`."""

import contextlib
import dataclasses
import functools
import importlib
import os
import re
import subprocess
import sys

from damptune import interrupt
from damptune.cli import main
from flows.signature import base_type, flow_params, source_defaults, source_descriptions
from flows.tune import flow_defaults, flow_descriptions, grid_of
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


def test_the_help_reads_the_flows_own_defaults_and_descriptions_from_its_source():
    # what `damptune tune --help` prints without importing the flow is what the flow has
    assert source_defaults() == flow_defaults()
    assert source_descriptions() == flow_descriptions()


def test_every_tune_option_is_a_flow_parameter_and_the_defaults_validate():
    flow = flow_defaults()
    settings, cells = grid_of({})
    shared = [a for a in flow["algorithms"] if shared_across_networks(a, settings)]
    # searched at one size per model, R times (the strong baseline)
    assert shared == ["geodamplr", "cntsdamplr"] and settings.baseline_searches == 4
    assert len(cells) == (len(flow["networks"]) * (len(flow["algorithms"]) - len(shared))
                          + len(shared) * settings.baseline_searches) * len(flow["models"])
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
    monkeypatch.setattr(interrupt, "install_sigint_handler", lambda **_: True)
    monkeypatch.setattr("flows.prefect_server.temporary_prefect_server",
                        lambda log_path: contextlib.nullcontext())  # no flow, no server
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--networks", "2", "--algorithms", "geodamp", "--models", "mlp",
                 "--trials", "mlp=1", "--grid-name", "tiny", "--no-progress", "--target", "0.3",
                 "--epochs", "mlp=2", "--concurrent-cells", "1", "--no-warm-start",
                 "--per-worker-batch", "16"]) == 0
    assert calls[0]["run_dir"] == str(tmp_path / "runs" / "tiny")
    # generated options reach the flow's parameters of their names, older flags too
    assert {k: calls[0][k] for k in ("networks", "target_accuracy", "epochs", "trials",
                                     "max_concurrent_cells", "warm_start", "per_worker_batch")
            } == {"networks": [2], "target_accuracy": 0.3, "epochs": {"mlp": 2.0},
                  "trials": {"mlp": 1}, "max_concurrent_cells": 1, "warm_start": False,
                  "per_worker_batch": 16}
    assert type(calls[0]["trials"]["mlp"]) is int  # a per-model count parses as an integer
    assert calls[0]["storage"] == f"sqlite:///{tmp_path}/runs/tiny/optuna.db"


@functools.cache  # one process per pytest process: it imports the whole flow (~10 s here)
def _tune_help() -> dict[str, str]:
    """``{flag: its help text}`` of `damptune tune --help` (a help a line), every flag of an
    option (``--target-accuracy`` and its older name ``--target``) mapped to the same text."""
    out = subprocess.run([sys.executable, "-m", "damptune", "tune", "--help"], check=True,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "2000"}).stdout
    helps: dict[str, str] = {}
    flags: list[str] = []
    for line in out[out.index("options:"):].splitlines()[1:]:
        if line.startswith("  -"):  # an option: its flags, then its help here or below
            head, _, text = line.strip().partition("  ")
            flags = re.findall(r"--[\w-]+", head)
            helps.update(dict.fromkeys(flags, text.strip()))
        elif line.startswith("   ") and flags:
            helps.update(dict.fromkeys(flags, f"{helps[flags[0]]} {line.strip()}".strip()))
    return helps


def test_cli_tune_has_an_option_per_flow_parameter_with_its_schema_description():
    """`damptune tune`'s options are generated from the flow: one per parameter (a switch
    for a parameter that defaults to true), its help the description the deployment's
    parameter schema gives it (Prefect's parser of the docstring)."""
    from prefect.utilities.callables import parameter_schema

    from flows.tune import tune

    schema = parameter_schema(tune).model_dump_for_openapi()["properties"]
    helps, flow = _tune_help(), flow_defaults()
    assert [p.name for p in flow_params()] == list(flow) == list(schema)
    for name, prop in schema.items():
        flag = "--" + ("no-" if flow[name] is True else "") + name.replace("_", "-")
        assert flag in helps, (flag, sorted(helps))
        assert " ".join(prop["description"].split()) in helps[flag], (flag, helps[flag])
    assert helps["--target"] == helps["--target-accuracy"]  # the older flags still work
    assert helps["--concurrent-cells"] == helps["--max-concurrent-cells"]
    types = {p.name: base_type(p.annotation) for p in flow_params()}
    assert types["trials"] == dict[str, int] | int and types["networks"] == list[int]
    assert types["sampler_seed"] is int and types["epochs"] == dict[str, float] | float


def test_cli_tune_help_prints_the_flow_defaults_once():
    """`damptune tune --help` shows, for each option, the default its flow parameter really
    has (the flow's signature), written as the option takes it, and never twice."""
    helps, flow = _tune_help(), flow_defaults()
    expected = {
        "--trials": ",".join(f"{m}={n}" for m, n in flow["trials"].items()),
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
    assert "the flow's" not in "".join(helps.values())
    for flag in set(helps) - {"--help", "--no-progress"}:  # the flow's: one default each
        assert helps[flag].count("default") == 1, (flag, helps[flag])
