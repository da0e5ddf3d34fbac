"""``make run`` (``python -m infra.main``): bad ``--grid`` and ``--param`` values refused
before anything starts, and every deployment's parameters (prefect.yaml,
infra/prefect-git.yaml) accepted by the flow's own validators. Its real run of a tiny grid, on
the deployment tests' stack: tests/test_e2e_deployment.py::test_make_run_runs_a_tiny_grid_...
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from damptune import ConfigError
from infra.main import EXIT_USAGE, check_parameters, deployment_parameters, main
from infra.progress import GridWatch
from infra.stack import REPO_ROOT, SERVICES, StackPaths, down, free_port
from tasks.grid import Cell
from tasks.search import storage_for
from tasks.sqlite import use_wal

PREFECT_FILES = [REPO_ROOT / "prefect.yaml", REPO_ROOT / "infra" / "prefect-git.yaml"]
CIFAR_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
               "test_batch")
# the tiny grid of the real run: one cell, 2 trials of 2 epochs, no held-out stages
TINY = {"networks": [2], "algorithms": ["geodamp"], "trials": 2, "epochs": 2,
        "validation_seeds": 0}


def _runs_of_each_deployment(prefect_file: Path) -> list[tuple[str, dict]]:
    """(label, parameters) of every run the file's deployments make: a run of the
    deployment, and a run of each of its schedules (the schedule's parameters over its)."""
    runs = []
    for deployment in yaml.safe_load(prefect_file.read_text())["deployments"]:
        name = deployment["name"]
        params = deployment_parameters(name, prefect_file)
        runs.append((name, params))
        for schedule in deployment.get("schedules") or []:
            runs.append((f"{name}@{schedule.get('slug')}",
                         {**params, **(schedule.get("parameters") or {})}))
    return runs


def _on_this_machine(params: dict, tmp_path: Path) -> dict:
    """``params`` with a ``data_root`` this machine lacks (grid-gpu's /data/...) replaced by a
    directory of tiny CIFAR-10 python batches in the real files' format: the validators read
    the data, and the data is a fact of the machine, not of the deployment."""
    import pickle

    import numpy as np

    root = params.get("data_root")
    if not root or Path(root).is_dir():
        return params
    stand_in = tmp_path / "cifar-10-batches-py"
    stand_in.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for name in CIFAR_FILES:
        batch = {b"labels": [int(v) for v in rng.integers(0, 10, 3)],
                 b"data": rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)}
        (stand_in / name).write_bytes(pickle.dumps(batch, protocol=2))
    return {**params, "data_root": str(stand_in)}


@pytest.mark.parametrize("prefect_file", PREFECT_FILES, ids=lambda p: p.name)
def test_every_deployment_passes_the_flows_validators(prefect_file, tmp_path):
    runs = _runs_of_each_deployment(prefect_file)
    assert {"grid", "smoke"} <= {label for label, _ in runs}, runs
    for label, params in runs:
        try:
            check_parameters(_on_this_machine(params, tmp_path))
        except ValueError as exc:  # ConfigError is one
            pytest.fail(f"{prefect_file.name}: deployment {label}: {exc}")


@pytest.mark.parametrize("bad, named", [
    ({"trials": 0}, "trials=0 is not accepted"),
    ({"epochs": "two"}, "epochs='two' is not accepted"),
    ({"grid_name": "a/b"}, "grid_name='a/b' is not accepted"),
    ({"trails": 3}, "trails=3 is not accepted; expected a parameter of flow tune"),
    ({"warm_start": "yes"}, "warm_start='yes' is not accepted; expected boolean"),
])
def test_a_deployment_with_a_bad_parameter_is_refused(tmp_path, bad, named):
    """What the test above does, on a copy of prefect.yaml whose smoke deployment carries a
    bad parameter: refused, naming it."""
    shipped = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    smoke = next(d for d in shipped["deployments"] if d["name"] == "smoke")
    smoke["parameters"].update(bad)
    broken = tmp_path / "prefect.yaml"
    broken.write_text(yaml.safe_dump(shipped, sort_keys=False))
    with pytest.raises(ConfigError) as refused:
        check_parameters(_on_this_machine(deployment_parameters("smoke", broken), tmp_path))
    assert named in str(refused.value)


# each: the arguments, and what the message must say (the parameter, the value given, what
# is accepted)
BAD_ARGS = {
    "epochs=0": (["--param", "epochs=0"], ["epochs=0 is not accepted",
                                            "a positive number of epochs"]),
    "networks=x": (["--param", "networks=x"], ["networks='x' is not accepted",
                                                "network sizes that are integers >= 1"]),
    "no-equals": (["--param", "foo"], ["--param='foo' is not accepted", "NAME=JSON"]),
    "unknown-name": (["--param", "foo=1"], ["foo=1 is not accepted",
                                            "a parameter of flow tune: networks, algorithms"]),
    "wrong-type": (["--param", 'warm_start="yes"'], ["warm_start='yes' is not accepted",
                                                     "boolean"]),
    "unknown-grid": (["--grid", "nope"], ["--grid='nope' is not accepted",
                                          "a deployment of prefect.yaml: grid, smoke"]),
}


@pytest.mark.parametrize("case", BAD_ARGS)
def test_bad_input_is_refused_with_status_2_before_anything_starts(case, tmp_path, capsys):
    """Exit status 2 (as ``damptune tune``'s bad input), a message naming the parameter, the
    value given and what is accepted, and nothing started: no stack directory, no server on
    the ports given, no run directory."""
    extra, said = BAD_ARGS[case]
    stack_dir, run_dir = tmp_path / "stack", tmp_path / "grid"
    ports = [free_port(), free_port()]
    argv = ["--grid", "smoke", "--run-dir", str(stack_dir), "--prefect-port", str(ports[0]),
            "--mlflow-port", str(ports[1]), "--timeout", "1",
            "--param", f"run_dir={json.dumps(str(run_dir))}", *extra]
    try:
        status = main(argv)  # an exception here would be a traceback of `python -m infra.main`
    finally:
        down(stack_dir)  # only if it wrongly started one
    out, err = capsys.readouterr()
    assert status == EXIT_USAGE, (status, out, err)
    assert err.startswith("python -m infra.main: error: "), err
    for text in said:
        assert text in err, err
    assert not stack_dir.exists() and not run_dir.exists()
    for port in ports:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)


def answers(url: str) -> int:
    """The HTTP status of the page at ``url`` opened as a browser does (its UI's pages are
    served to a navigation: ``Accept: text/html``)."""
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def stack_pids(stack_dir: Path) -> dict[str, str]:
    paths = StackPaths(stack_dir)
    return {n: paths.pid_file(n).read_text() for n in SERVICES if paths.pid_file(n).exists()}


def flow_runs(api_url: str) -> int:
    request = urllib.request.Request(f"{api_url}/flow_runs/count", data=b"{}",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.loads(response.read()))


def make_run(stack_dir: Path, ports: dict[str, int], params: dict) -> subprocess.CompletedProcess:
    """``make run RUN_ARGS='--grid smoke ... --param NAME=JSON ...'`` from the repository root,
    with this interpreter's environment (its stamp taken as made: nothing is installed)."""
    args = ["--grid", "smoke", "--run-dir", str(stack_dir),
            "--prefect-port", str(ports["prefect"]), "--mlflow-port", str(ports["mlflow"])]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    return subprocess.run(["make", "-o", ".venv/.installed", "run",
                           f"BIN={Path(sys.executable).parent}", f"RUN_ARGS={shlex.join(args)}"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200,
                          stdin=subprocess.DEVNULL)


def test_progress_never_makes_the_tables_of_a_storage_the_flow_is_making(tmp_path):
    """`make run`'s progress line, looking while the flow makes its Optuna storage (the file
    there in WAL mode, its tables not yet): it shows nothing and makes no table (it made them
    through Optuna, racing the flow, whose run then failed: "table studies already exists");
    once the flow made them, it counts."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    use_wal(url)  # what the flow's storage_for does first
    watch = GridWatch(url, "g", [(Cell(2, "geodamp", "mlp"), 2)])
    assert watch.look() is None
    with contextlib.closing(sqlite3.connect(tmp_path / "optuna.db")) as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []
    storage_for(url)  # the flow makes the tables
    made = watch.look()
    assert made is not None and (made.trials_done, made.trials) == (0, 2), made
