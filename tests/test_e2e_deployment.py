"""End to end: the local stack, `prefect deploy --all`, `prefect deployment run tune/smoke`.

A real Prefect server, process worker and MLflow server on free ports; the flow run's trials
land in the Optuna storage of its run directory and in the MLflow server (parent run per cell,
child run per trial); a ``--param`` outside the parameter schema is refused by the server,
and one only the flow can check ends Failed with the ConfigError's text; a headless Chromium
screenshot of the experiment's page in the MLflow UI is kept in
``runs/screenshots/mlflow-ui.png``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import psutil
import pytest

from infra.main import EXIT_USAGE, experiment_url, main, wait_for_flow_run
from infra.prefect_api import client, run_deployment
from infra.stack import REPO_ROOT, Stack, free_port, running_stack, up
from tests.flows.grids import GRID, runs_per_trial, trials_of
from tests.infra.test_main import TINY, answers, flow_runs, make_run, stack_pids

CHROMIUM = Path("/usr/bin/chromium")
NETWORK, ALGORITHM, MODEL = 2, "geodamp", "mlp"


def _api(url: str, payload: dict | None = None) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _experiment(mlflow_uri: str, name: str) -> dict:
    """The experiment ``name`` on the MLflow server, through its REST API."""
    return _api(f"{mlflow_uri}/api/2.0/mlflow/experiments/get-by-name"
                f"?experiment_name={urllib.parse.quote(name)}")["experiment"]


def _mlflow_runs(mlflow_uri: str, experiment_id: str) -> list[dict]:
    """The runs of an experiment on the MLflow server, through its REST API."""
    return _api(f"{mlflow_uri}/api/2.0/mlflow/runs/search",
                {"experiment_ids": [experiment_id], "max_results": 1000}).get("runs", [])


def _trial_keys(mlflow_uri: str, experiment_name: str) -> list[tuple[str, str]]:
    """(cell, trial number) of every trial run of the experiment, one per run."""
    keys = []
    for r in _mlflow_runs(mlflow_uri, _experiment(mlflow_uri, experiment_name)["experiment_id"]):
        tags = {t["key"]: t["value"] for t in r["data"].get("tags", [])}
        if tags.get("damptune.kind") == "trial":
            keys.append((tags["damptune.cell"], tags["damptune.trial_number"]))
    return keys


def _cli(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """`prefect ARGS`; it must succeed (``ok``) or fail."""
    env = {**env, "PWD": str(REPO_ROOT)}  # prefect.yaml's pull step uses {{ $PWD }}
    result = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", *args], env=env,
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert (result.returncode == 0) == ok, (
        f"prefect {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def _start(env: dict[str, str], deployment: str, params: dict) -> str:
    """`prefect deployment run` with ``params`` (each a ``--param``); the flow run's id."""
    args = []
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    created = _cli(env, "deployment", "run", deployment, *args)
    return next(line.split()[-1] for line in created.stdout.splitlines() if "UUID" in line)


def _run_deployment(api_url: str, deployment: str, params: dict) -> str:
    """A run of ``deployment`` ("flow/name") with ``params``, created with Prefect's client (what
    `prefect deployment run` and `make run` call; the smoke test runs that command itself)."""
    return str(run_deployment(api_url, deployment, params))


def _cancel(api_url: str, flow_run_id: str) -> None:
    """Cancel a flow run with Prefect's client, as `prefect flow-run cancel` does: its state
    becomes Cancelling, and its worker ends the process."""
    from prefect.states import Cancelling

    with client(api_url) as c:
        c.set_flow_run_state(flow_run_id, Cancelling())


def _flow_run_logs(api_url: str, flow_run_id: str) -> str:
    logs = _api(f"{api_url}/logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run_id]}},
                                           "sort": "TIMESTAMP_ASC", "limit": 200})
    return "\n".join(f"{log['level']:>3} {log['message']}" for log in logs)


def _screenshot(url: str, out: Path, profile_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile_dir}", "--window-size=1400,900",
         "--virtual-time-budget=15000", f"--screenshot={out}", url],
        capture_output=True, text=True, timeout=180,
    )


@dataclass(frozen=True)
class Deployed:
    """The module's local stack with prefect.yaml's deployments registered."""

    stack: Stack
    ports: dict[str, int]
    env: dict[str, str]  # a client process's environment on this stack

    @property
    def api(self) -> str:
        return self.stack.prefect_api_url


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory) -> Iterator[Deployed]:
    """One local stack and one `prefect deploy --all` for this module's tests of prefect.yaml
    as shipped (a stack and a deploy cost ~40 s). Each test has its own run directory, and
    its own MLflow experiment on the server (a grid's runs are found again by grid name and
    cell: two grids of one name would share them) or its own tracking store."""
    ports = {"prefect_port": free_port(), "mlflow_port": free_port()}
    with running_stack(tmp_path_factory.mktemp("stack"), **ports) as stack:
        deployed = Deployed(stack, ports, {**os.environ, **stack.env})
        _cli(deployed.env, "deploy", "--all")
        yield deployed


@pytest.fixture
def deployed(shared_stack: Deployed) -> Iterator[Deployed]:
    """The shared stack, left for the next test as this one found it: its services up (a test
    kills the worker) and no flow run of this test still holding the deployment's slot."""
    yield shared_stack
    up(shared_stack.stack.run_dir, **shared_stack.ports)
    unfinished = _api(f"{shared_stack.api}/flow_runs/filter", {"flow_runs": {"state": {
        "type": {"any_": ["SCHEDULED", "PENDING", "RUNNING", "CANCELLING", "PAUSED"]}}}})
    for run in unfinished:
        _cancel(shared_stack.api, run["id"])
        wait_for_flow_run(shared_stack.api, run["id"], timeout_s=300)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_deployment_smoke_run_lands_in_optuna_and_mlflow(tmp_path, deployed):
    if not (REPO_ROOT / "prefect.yaml").is_file():
        pytest.fail("prefect.yaml is missing at the repository root")
    run_dir = tmp_path / "smoke"
    env, api, mlflow_uri = deployed.env, deployed.api, deployed.stack.mlflow_uri
    flow_run_id = _start(env, "tune/smoke", {
        "networks": [NETWORK], "algorithms": [ALGORITHM], "models": [MODEL], "trials": 2,
        "epochs": 2, "run_dir": str(run_dir)})
    flow_run = wait_for_flow_run(api, flow_run_id, timeout_s=600)
    state = flow_run["state"]
    assert state["type"] == "COMPLETED", (
        f"flow run ended {state['name']}: {state.get('message')}\n"
        f"{_flow_run_logs(api, flow_run_id)}")
    grid_name = flow_run["parameters"].get("grid_name", "smoke")

    # Optuna: the cell's study in the default storage of the run directory
    study = optuna.load_study(study_name=f"{grid_name}/n{NETWORK}/{ALGORITHM}/{MODEL}",
                              storage=f"sqlite:///{run_dir}/optuna.db")
    finished = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                       optuna.trial.TrialState.PRUNED)]
    assert len(study.trials) == 2 and len(finished) == 2, study.trials

    # MLflow (the server the worker's flow runs log to): a parent run, two children
    experiment = _experiment(mlflow_uri, f"damptune-{grid_name}")
    runs = _mlflow_runs(mlflow_uri, experiment["experiment_id"])
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])}
            for r in runs}
    parents = {t.get("damptune.stage"): rid for rid, t in tags.items()
               if "damptune.cell" in t and "mlflow.parentRunId" not in t}
    assert sorted(parents) == ["search", "selection", "validation"], tags
    assert tags[parents["search"]]["damptune.cell"] == f"n{NETWORK}/{ALGORITHM}/{MODEL}"
    children = [rid for rid, t in tags.items()
                if t.get("mlflow.parentRunId") == parents["search"]]
    assert len(children) == 2, tags
    # the validation stage: the best configuration on the smoke deployment's 2 held-out
    # seeds, a parent run and a child per seed, tagged damptune.stage=validation
    held_out = [t for t in tags.values()
                if t.get("mlflow.parentRunId") == parents["validation"]]
    assert len(held_out) == 2 and all(t["damptune.stage"] == "validation"
                                      for t in held_out), tags

    # bad input through the deployment. A value outside the parameter schema's bounds:
    # Prefect's server refuses the run before creating it, naming the field
    with client(api) as c:
        runs_before = len(c.read_flow_runs())
    refused = _cli(env, "deployment", "run", "tune/smoke", "--param", "trials=0", ok=False)
    said = " ".join((refused.stdout + refused.stderr).split())  # Rich wraps its lines
    assert "Validation failed for field 'trials'" in said, said
    assert "Failure reason: 0 is less than the minimum of 1" in said, said
    with client(api) as c:
        assert len(c.read_flow_runs()) == runs_before
    # one only the flow can check (per-model epochs missing the smoke grid's model): the
    # flow run ends Failed with the ConfigError's text, and nothing reaches the grid's
    # stores (no run directory, no new MLflow run)
    bad_dir = tmp_path / "bad"
    bad = _start(env, "tune/smoke", {"epochs": {"cnn": 3.0}, "run_dir": str(bad_dir)})
    bad_state = wait_for_flow_run(api, bad, timeout_s=300)["state"]
    assert bad_state["type"] == "FAILED", bad_state
    assert "epochs={'cnn': 3.0} is not accepted" in (bad_state.get("message") or ""), bad_state
    assert not bad_dir.exists()
    after = _mlflow_runs(mlflow_uri, experiment["experiment_id"])
    assert len(after) == len(runs), after

    # the MLflow UI page of the experiment, as a user sees it
    if not CHROMIUM.exists():
        if os.environ.get("CI"):  # .ci/run installs it: its absence there is a defect
            pytest.fail(f"{CHROMIUM} is absent in CI: .ci/run must install chromium")
        pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium): no UI screenshot; "
                    "the Optuna and MLflow checks above passed")
    png = tmp_path / "mlflow-ui.png"
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    # the experiment's page at the address `make run` prints (infra.main.experiment_url):
    # MLflow 3.17 keeps its GenAI/model-training switch per browser, GenAI by default; the
    # address selects model training, and the experiment is tagged as model training
    assert {t["key"]: t["value"] for t in experiment.get("tags", [])}.get(
        "mlflow.experimentKind") == "custom_model_development", experiment
    shot = _screenshot(experiment_url(mlflow_uri, experiment["experiment_id"]), png, profile)
    assert png.is_file(), f"chromium exited {shot.returncode}:\n{shot.stderr[-3000:]}"
    assert png.stat().st_size > 10_000, png.stat().st_size
    kept = REPO_ROOT / "runs" / "screenshots" / "mlflow-ui.png"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, kept)


def _when_training(run_dir: Path) -> None:
    """Wait until the grid of ``run_dir`` has written a checkpoint (trials train)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not list(run_dir.rglob("*.pt")):
        time.sleep(0.2)
    assert list(run_dir.rglob("*.pt")), "the grid never started training"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_sigkill_of_the_prefect_worker_then_rerun(tmp_path, deployed, clean):
    """Fault injection: SIGKILL the Prefect worker while the grid trains, bring the stack back
    (a new worker), run the deployment again.

    The flow run the dead worker launched loses its console (the pipe the worker read) and goes
    on: it notes so in its Prefect log and completes; the rerun, queued behind the deployment's
    concurrency limit, then finds every trial done. Every trial finished exactly once in
    Optuna, one MLflow run per trial on the server, and values equal to a clean run's (the
    session's, tests/conftest.py: the same grid, parameters and name, never disturbed). Then,
    on the same stack, a run cancelled from the API mid-grid ends Cancelled, and its rerun
    ends equal to that clean run too."""
    api = deployed.api
    params = {**GRID, "grid_name": "g"}  # the clean run's grid (the deployment's are replaced)
    run_dir = tmp_path / "grid"
    first = _run_deployment(api, "tune/smoke", {**params, "run_dir": str(run_dir)})
    _when_training(run_dir)
    worker = psutil.Process(int((deployed.stack.run_dir / "pids" / "prefect-worker.pid")
                                .read_text()))
    worker.send_signal(signal.SIGKILL)
    psutil.wait_procs([worker], timeout=30)  # dead (a SIGKILL is not instantaneous)

    up(deployed.stack.run_dir, **deployed.ports)  # a new worker; runs whose process died are
    # marked Crashed
    second = _run_deployment(api, "tune/smoke", {**params, "run_dir": str(run_dir)})
    flow_run = wait_for_flow_run(api, second, timeout_s=1200)
    assert flow_run["state"]["type"] == "COMPLETED", _flow_run_logs(api, second)
    orphan = wait_for_flow_run(api, first, timeout_s=60)
    logs = _flow_run_logs(api, first)
    assert orphan["state"]["type"] == "COMPLETED", logs
    assert "console of this process is gone" in logs, logs

    got = trials_of(str(run_dir), "g")
    assert all([t[0] for t in trials] == list(range(len(trials))) for trials in got.values())
    assert all(t[1] in ("COMPLETE", "PRUNED") for ts in got.values() for t in ts), got
    assert got == clean
    trial_keys = _trial_keys(deployed.stack.mlflow_uri, "damptune-g")
    # every trial of the clean run's grid (GRID: its search), once each
    n_trials = sum(len(trials) for trials in clean.values())
    assert len(trial_keys) == n_trials and len(set(trial_keys)) == n_trials, trial_keys

    # cancelled from the API mid-grid (`prefect flow-run cancel`): the run ends Cancelled,
    # and a rerun ends equal to the clean run, one MLflow run per trial
    cancel_dir = tmp_path / "cancelled"
    cancel_params = {**params, "run_dir": str(cancel_dir),
                     "tracking_uri": f"sqlite:///{cancel_dir}/mlflow.db"}
    third = _run_deployment(api, "tune/smoke", cancel_params)
    _when_training(cancel_dir)
    _cancel(api, third)
    # the worker ends the process (SIGTERM: its trials checkpoint), then sets Cancelled; the
    # engine may say Crashed ("aborted by a termination signal") a moment before that
    deadline = time.monotonic() + 300
    while (state := _api(f"{api}/flow_runs/{third}")["state"])["type"] != "CANCELLED" and (
            time.monotonic() < deadline):
        time.sleep(2)
    assert state["type"] == "CANCELLED", (state, _flow_run_logs(api, third))
    fourth = _run_deployment(api, "tune/smoke", cancel_params)
    assert wait_for_flow_run(api, fourth, timeout_s=900)["state"][
        "type"] == "COMPLETED", _flow_run_logs(api, fourth)
    assert trials_of(str(cancel_dir), "g") == clean
    runs = runs_per_trial(cancel_dir, "g")  # (cell, trial number) -> its MLflow runs
    assert len(runs) == n_trials and set(runs.values()) == {1}, runs


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_flow_run_whose_machine_died_is_crashed_by_heartbeat_then_rerun(tmp_path, deployed,
                                                                          clean):
    """Machine death: the Prefect worker and the flow-run process (with its Dask workers) are
    SIGKILLed at once, and nothing on that machine reports it. The run stops sending heartbeats;
    the stack's zombie automation marks it Crashed (which frees the deployment's concurrency
    slot). A new worker and a rerun then finish the grid: every trial once in Optuna, one
    MLflow run per trial (in the run directory's store: the server's experiment "damptune-g"
    is the worker-kill test's), and values equal to the clean run's cell (the session's clean
    grid, of which this grid is the geodamp cell: a cell's trials do not depend on the
    others')."""
    from infra.stack import ZOMBIE_AUTOMATION

    api = deployed.api
    automations = _api(f"{api}/automations/filter", {})
    assert ZOMBIE_AUTOMATION in {a["name"] for a in automations}
    run_dir = tmp_path / "grid"
    params = {**GRID, "algorithms": ["geodamp"], "grid_name": "g", "run_dir": str(run_dir),
              "tracking_uri": f"sqlite:///{run_dir}/mlflow.db"}
    first = _run_deployment(api, "tune/smoke", params)
    _when_training(run_dir)
    engines = [p for p in psutil.process_iter(["cmdline", "environ"])
               if (p.info["cmdline"] or [])[1:3] == ["-m", "prefect.engine"]  # its forkserver
               # names the module in its preload list, and its Dask workers are forks of that
               and (p.info["environ"] or {}).get("PREFECT__FLOW_RUN_ID") == first]
    assert len(engines) == 1, engines
    os.kill(int((deployed.stack.run_dir / "pids" / "prefect-worker.pid").read_text()),
            signal.SIGKILL)
    os.killpg(engines[0].pid, signal.SIGKILL)  # the flow run, its Dask workers: all gone

    deadline = time.monotonic() + 300  # 3 missed heartbeats (90 s), then the trigger
    while time.monotonic() < deadline:
        state = _api(f"{api}/flow_runs/{first}")["state"]
        if state["type"] != "RUNNING":
            break
        time.sleep(2)
    assert state["type"] == "CRASHED", state
    assert "no heartbeat" in (state.get("message") or ""), state

    up(deployed.stack.run_dir, **deployed.ports)  # a new worker on a new machine
    second = _run_deployment(api, "tune/smoke", params)
    flow_run = wait_for_flow_run(api, second, timeout_s=600)
    assert flow_run["state"]["type"] == "COMPLETED", _flow_run_logs(api, second)
    cell = "n2/geodamp/mlp"
    got = trials_of(str(run_dir), "g")
    assert sorted(got) == [cell], got
    assert got == {k: v for k, v in clean.items() if k.startswith(cell)}
    # one MLflow run per trial (its 3 search trials), the trial that trained at the death
    # continued in its own run
    runs = runs_per_trial(run_dir, "g")  # (cell, trial number) -> its MLflow runs
    assert len(runs) == sum(len(t) for t in got.values()) and set(runs.values()) == {1}, runs


# README "Spot clusters": how grid-spot's schedule is turned on (`active: true` on the schedule of
# slug grid-spot-every-6h in prefect.yaml, then this; the slug makes it update that schedule)
TURN_ON = "prefect --no-prompt deploy --name grid-spot"


def _spot_copy(tmp_path: Path, *, active: bool) -> tuple[Path, dict, dict]:
    """prefect.yaml's grid-spot alone, changed only where this machine needs it: its schedule
    every 5 s instead of every 6 h, distributed's SpecCluster of infra/cluster-spec.yaml
    instead of SLURM, files under ``tmp_path``, a grid of 1 cell, 1 trial, 1 epoch; the
    schedule ``active`` or not. The path of the copy, the shipped deployment and the copy's."""
    import copy

    import yaml

    shipped = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    spot = next(d for d in shipped["deployments"] if d["name"] == "grid-spot")
    ours = copy.deepcopy(spot)
    ours["parameters"].update(
        cluster="infra/cluster-spec.yaml", checkpoint_root=str(tmp_path / "checkpoints"),
        run_dir=str(tmp_path / "grid"), networks=[NETWORK], algorithms=[ALGORITHM],
        models=[MODEL], trials=1, epochs=1, target_accuracy=0.3, validation_seeds=0)
    schedule = ours["schedules"][0]
    del schedule["cron"]
    schedule.update(interval=5, active=active)  # due every 5 s; the worker prefetches 10 s
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump({**shipped, "deployments": [ours]}, sort_keys=False))
    return path, spot, ours


def _scheduled_runs(api: str, deployment_id: str, stack_dir: Path) -> list[dict]:
    """The deployment's runs once Prefect's scheduler made some (else fail with its log)."""
    runs_filter = {"flow_runs": {"deployment_id": {"any_": [deployment_id]}},
                   "sort": "EXPECTED_START_TIME_ASC"}
    deadline = time.monotonic() + 120
    while not (runs := _api(f"{api}/flow_runs/filter", runs_filter)):
        if time.monotonic() > deadline:  # e.g. Prefect 3.8.8 with SQLAlchemy 2.1 (pyproject)
            log = (stack_dir / "logs" / "prefect-server.log").read_text()
            pytest.fail(f"the scheduler made no run in 120 s; its server's log:\n{log[-3000:]}")
        time.sleep(2)
    return runs


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grid_spot_schedule_runs_with_its_parameters_and_cancels_colliding_runs(
        tmp_path, monkeypatch):
    """The grid-spot deployment (a copy of prefect.yaml's, see ``_spot_copy``) is deployed
    with its schedule off, then turned on as the README says (``active: true``, deploy again:
    the slug updates the same schedule); Prefect's scheduler creates runs carrying the
    schedule's parameters over the deployment's; the first one the worker picks up completes
    on a SpecCluster from a cluster YAML; runs that arrive while it holds the deployment's
    slot are Cancelled (CANCEL_NEW), never queued. On the same server,
    `prefect automation create --from-file` takes the zombie automation's file as the stack
    did."""
    from datetime import datetime

    from infra.prefect_api import ZOMBIE_AUTOMATION, ZOMBIE_AUTOMATION_FILE

    assert TURN_ON in (REPO_ROOT / "README.md").read_text()
    copy, shipped, ours = _spot_copy(tmp_path, active=False)
    schedule = shipped["schedules"][0]
    assert schedule["active"] is False and schedule["slug"] == "grid-spot-every-6h", schedule
    assert schedule.get("parameters", {}).get("max_cluster_lifetime"), schedule  # not 6 h
    expected = {**ours["parameters"], **schedule["parameters"]}

    # the scheduler service looks at schedules every 5 s instead of 60; 2 flow runs at once,
    # so that the worker proposes a colliding run while the first holds the slot
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "5")
    stack_dir = tmp_path / "stack"
    with running_stack(stack_dir, prefect_port=free_port(), mlflow_port=free_port(),
                       worker_limit=2) as stack:
        env = {**os.environ, **stack.env}
        api = stack.prefect_api_url
        _cli(env, *TURN_ON.split()[2:], "--prefect-file", str(copy))
        off = _api(f"{api}/deployments/name/tune/grid-spot")["schedules"]
        assert [(s["slug"], s["active"], s["parameters"]) for s in off] == [
            (schedule["slug"], False, schedule["parameters"])], off

        _spot_copy(tmp_path, active=True)  # what a user edits in prefect.yaml, then TURN_ON
        _cli(env, *TURN_ON.split()[2:], "--prefect-file", str(copy))
        deployment = _api(f"{api}/deployments/name/tune/grid-spot")
        assert [(s["id"], s["active"]) for s in deployment["schedules"]] == [
            (off[0]["id"], True)], deployment["schedules"]  # the same schedule, turned on

        _cli(env, "automation", "create", "--from-file", str(ZOMBIE_AUTOMATION_FILE))
        zombies = [a for a in _api(f"{api}/automations/filter", {})
                   if a["name"] == ZOMBIE_AUTOMATION]
        assert len(zombies) == 2, zombies  # the stack's, and the CLI's from the same file
        same = [{**a["trigger"], "id": None} for a in zombies]  # a trigger has its own id
        assert same[0] == same[1] and zombies[0]["actions"] == zombies[1]["actions"]

        runs = _scheduled_runs(api, deployment["id"], stack_dir)
        deadline = time.monotonic() + 600
        while not (ended := [r for r in runs if r["state"]["type"] in (
                "COMPLETED", "FAILED", "CRASHED")]) and time.monotonic() < deadline:
            time.sleep(2)
            runs = _scheduled_runs(api, deployment["id"], stack_dir)
        assert ended, [(r["name"], r["state"]["name"]) for r in runs]
        first = ended[0]
        assert first["state"]["type"] == "COMPLETED", _flow_run_logs(api, first["id"])
        for run in runs:  # every scheduled run: the deployment's parameters, the schedule's
            assert run["auto_scheduled"] and run["parameters"] == {
                **run["parameters"], **expected}, run["parameters"]

        held = {s["type"]: datetime.fromisoformat(s["timestamp"]) for s in _api(
            f"{api}/flow_run_states/?flow_run_id={first['id']}")}
        cancelled = [r for r in runs if r["state"]["type"] == "CANCELLED" and held["PENDING"]
                     <= datetime.fromisoformat(r["state"]["timestamp"]) <= held["COMPLETED"]]
        assert cancelled, [(r["name"], r["state"]) for r in runs]
        assert all(r["state"]["message"] == "Deployment concurrency limit reached."
                   for r in cancelled), cancelled
        assert not [r for r in runs if r["state"]["name"] == "AwaitingConcurrencySlot"]
        study = optuna.load_study(study_name=f"grid-spot/n{NETWORK}/{ALGORITHM}/{MODEL}",
                                  storage=f"sqlite:///{tmp_path / 'grid'}/optuna.db")
        assert [t.state.name for t in study.trials] in (["COMPLETE"], ["PRUNED"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_make_run_runs_a_tiny_grid_prints_live_addresses_and_refuses_a_bad_param(
        tmp_path, deployed, capsys):
    """`make run RUN_ARGS=...` on the module's stack (``infra.main`` reuses a running stack of
    its run directory: what a second `make run` does), the smoke deployment with a tiny grid's
    ``--param`` values: exit 0, the Prefect and MLflow addresses it prints are 127.0.0.1 and
    answer, the grid's trials are in Optuna. Then ``infra.main`` with ``--param epochs=0``:
    status 2 naming it, no new flow run in the Prefect API, no run directory, the stack's
    processes untouched."""
    stack_dir, run_dir = Path(deployed.stack.run_dir), tmp_path / "tiny"
    ports = {"prefect": deployed.ports["prefect_port"], "mlflow": deployed.ports["mlflow_port"]}
    # a grid name of its own: the module's other tests count the runs of theirs in MLflow
    done = make_run(stack_dir, ports, {**TINY, "run_dir": str(run_dir), "grid_name": "mr"})
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-6000:]
    prefect_ui = re.search(r"^Prefect UI: (\S+)  \(this run: (\S+)\)", done.stdout, re.M)
    mlflow_ui = re.search(r"^MLflow UI:  (\S+)  \(experiment damptune-mr: (\S+)\)",
                          done.stdout, re.M)
    assert prefect_ui and mlflow_ui, done.stdout[-3000:]
    for url, port in ((prefect_ui[1], ports["prefect"]), (prefect_ui[2], ports["prefect"]),
                      (mlflow_ui[1], ports["mlflow"]), (mlflow_ui[2], ports["mlflow"])):
        assert (urllib.parse.urlparse(url).scheme, urllib.parse.urlparse(url).hostname,
                urllib.parse.urlparse(url).port) == ("http", "127.0.0.1", port), url
        assert answers(url) == 200, url
    # the --param values reached the run: the tiny grid's one cell (not the smoke deployment's
    # two, nor its held-out stages), its 2 trials finished
    storage = f"sqlite:///{run_dir}/optuna.db"
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == [
        "mr/n2/geodamp/mlp"]
    study = optuna.load_study(study_name="mr/n2/geodamp/mlp", storage=storage)
    assert [t.state.name in ("COMPLETE", "PRUNED") for t in study.trials] == [True] * 2, (
        study.trials)

    runs, pids = flow_runs(deployed.api), stack_pids(stack_dir)
    bad_dir = tmp_path / "bad"
    capsys.readouterr()
    status = main(["--grid", "smoke", "--run-dir", str(stack_dir), "--prefect-port",
                   str(ports["prefect"]), "--mlflow-port", str(ports["mlflow"]),
                   "--param", f"run_dir={json.dumps(str(bad_dir))}", "--param", "epochs=0"])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE, err
    assert "epochs=0 is not accepted; expected a positive number of epochs" in err, err
    assert flow_runs(deployed.api) == runs and stack_pids(stack_dir) == pids
    assert not bad_dir.exists()
