"""infra/prefect-git.yaml: prefect.yaml's deployments with pull steps that clone the repository
(Prefect's git_clone step, its URL in the Prefect variable ``damptune_repository``), install it
into the worker's Python with constraints.txt, and run the flow in the clone: a worker on any
host, in any directory, runs them.

The slow test does what a user of another host does: a bare repository made from this one
(committed files only: what a push would give), the variables set, ``prefect deploy
--prefect-file infra/prefect-git.yaml``, then a worker started with ``prefect worker start``
from an empty directory, in a virtualenv of its own (no damptune in it; the test venv's
packages reached through a ``.pth`` file so that nothing is downloaded, and the pull step's
``pip install`` writes into that virtualenv only).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from infra.prefect_api import recent_logs, run_deployment, wait_for_flow_run
from infra.stack import POOL, REPO_ROOT, _stop_process, base_env, down, free_port, running_stack

GIT_YAML = REPO_ROOT / "infra" / "prefect-git.yaml"
NETWORK, ALGORITHM, MODEL = 2, "geodamp", "mlp"
# a module of the worker's virtualenv (imported by a .pth file at every start of its python):
# each import of damptune in its processes appends where it came from to $DAMPTUNE_ORIGIN_LOG
ORIGIN_PROBE = """
import os, sys
from importlib.machinery import PathFinder


class DamptuneOrigin:
    @staticmethod
    def find_spec(name, path=None, target=None):
        log = os.environ.get("DAMPTUNE_ORIGIN_LOG")
        if name != "damptune" or not log:
            return None
        spec = PathFinder.find_spec(name, path)  # as the import system would find it
        with open(log, "a") as f:
            f.write(f"{spec.origin if spec else None}\\n")
        return spec


sys.meta_path.insert(0, DamptuneOrigin)
"""


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _step(steps: list[dict], name: str) -> dict:
    return next(s[f"prefect.deployments.steps.{name}"] for s in steps
                if f"prefect.deployments.steps.{name}" in s)


def test_prefect_git_yaml_has_prefect_yaml_deployments_with_git_pull_steps():
    """The same deployments as prefect.yaml (names, parameters, schedules, limits), on the
    same pool; only the job variables (a lasting working_dir) and the pull steps differ: clone
    from the variable, install with constraints.txt, work in the clone."""
    shipped, git = _load(REPO_ROOT / "prefect.yaml"), _load(GIT_YAML)

    def without_job_variables(deployment: dict) -> dict:
        return {**deployment, "work_pool": {"name": deployment["work_pool"]["name"]}}

    drift = ("infra/prefect-git.yaml must keep prefect.yaml's deployments and its work pool's "
             "env: copy prefect.yaml's change there (its `deployments:` section verbatim)")
    assert ([without_job_variables(d) for d in git["deployments"]]
            == [without_job_variables(d) for d in shipped["deployments"]]), drift
    for deployment in git["deployments"]:
        variables = deployment["work_pool"]["job_variables"]
        assert variables["working_dir"] == "."  # the worker's directory, kept between runs
        assert variables["env"] == shipped["deployments"][0]["work_pool"]["job_variables"][
            "env"], drift

    steps = git["pull"]
    assert list(steps[0]) == ["prefect.deployments.steps.git_clone"]
    clone = _step(steps, "git_clone")
    assert clone["repository"] == "{{ prefect.variables.damptune_repository }}"
    assert clone["id"] == "clone"
    install = _step(steps, "pip_install_requirements")
    assert install["directory"] == "{{ clone.directory }}"
    requirements = (REPO_ROOT / install["requirements_file"]).read_text().split("\n")
    constraints = next(line.split()[1] for line in requirements if line.startswith("-c "))
    assert (REPO_ROOT / install["requirements_file"]).parent.joinpath(constraints).resolve() \
        == REPO_ROOT / "constraints.txt"
    assert "." in requirements
    assert steps[-1] == {"prefect.deployments.steps.set_working_directory": {
        "directory": "{{ clone.directory }}"}}


def _prefect(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`prefect ARGS` from the repository root; it must succeed."""
    done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", *args], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def _worker_venv(path: Path) -> Path:
    """A virtualenv without damptune (nor pip: the test venv's, as all its packages, come
    through a .pth file) whose site-packages records where damptune is imported from; its
    python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_path('purelib'))"], check=True,
                               capture_output=True, text=True).stdout.strip())
    (site / "damptune-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (site / "damptune_origin_probe.py").write_text(ORIGIN_PROBE)
    (site / "damptune-origin.pth").write_text("import damptune_origin_probe\n")
    return python


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_git_deployment_runs_on_a_worker_in_another_directory(tmp_path):
    bare = tmp_path / "damptune.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(REPO_ROOT), str(bare)], check=True)
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    worker_dir, origins = tmp_path / "worker", tmp_path / "origins.txt"
    worker_dir.mkdir()
    python = _worker_venv(tmp_path / "worker-venv")
    ours = sorted(p.name for p in Path(sysconfig.get_path("purelib")).iterdir())

    stack_dir = tmp_path / "stack"
    with running_stack(stack_dir, prefect_port=free_port(), mlflow_port=free_port()) as stack:
        down(stack_dir, services=("prefect-worker",))  # the stack's worker runs in this checkout
        env = {**os.environ, **stack.env}
        _prefect(env, "variable", "set", "damptune_repository", f"file://{bare}")
        _prefect(env, "variable", "set", "damptune_commit", commit)
        _prefect(env, "deploy", "--all", "--prefect-file", str(GIT_YAML))

        worker_env = {k: v for k, v in {**base_env(), **stack.env}.items()
                      if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        worker_env.update(PREFECT_HOME=str(tmp_path / "worker-home"),
                          PREFECT_WORKER_QUERY_SECONDS="2", DAMPTUNE_ORIGIN_LOG=str(origins))
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [str(python), "-m", "prefect", "--no-prompt", "worker", "start", "--pool", POOL,
                 "--type", "process", "--name", "git-worker", "--limit", "1"],
                cwd=worker_dir, env=worker_env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            t0 = time.monotonic()
            flow_run_id = run_deployment(stack.prefect_api_url, "tune/smoke", {
                "networks": [NETWORK], "algorithms": [ALGORITHM], "models": [MODEL],
                "trials": 2, "epochs": 2, "validation_seeds": 0})
            state = wait_for_flow_run(stack.prefect_api_url, flow_run_id, timeout_s=600)["state"]
            took = time.monotonic() - t0
        finally:
            _stop_process(psutil.Process(worker.pid), timeout_s=20)
        logs = "\n".join(r["message"] for r in recent_logs(stack.prefect_api_url,
                                                           flow_run_id, 200))
        assert state["type"] == "COMPLETED", (
            f"flow run ended {state['name']}: {state.get('message')}\n{logs}\n"
            f"worker log:\n{log.read_text()[-6000:]}")

    clone = worker_dir / "damptune"
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert head == commit  # damptune_commit's commit, cloned into the worker's directory
    # damptune of the flow run came from the clone (first on its PYTHONPATH), never this checkout
    imported = set(origins.read_text().split()) if origins.exists() else set()
    assert imported and all(Path(f).is_relative_to(clone) for f in imported), imported
    # the pull step installed it into the worker's virtualenv (from the clone), not the test's
    site = next((tmp_path / "worker-venv" / "lib").glob("python3*/site-packages"))
    assert (site / "damptune" / "__init__.py").is_file()
    assert f'"url": "file://{clone}"' in next(site.glob("damptune-*.dist-info")).joinpath(
        "direct_url.json").read_text()
    assert sorted(p.name for p in Path(sysconfig.get_path("purelib")).iterdir()) == ours

    # the results: the cell's study in runs/smoke beside the clone (its runs/ links there)
    study = optuna.load_study(study_name=f"smoke/n{NETWORK}/{ALGORITHM}/{MODEL}",
                              storage=f"sqlite:///{worker_dir / 'runs' / 'smoke' / 'optuna.db'}")
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 2, study.trials
    assert (clone / "runs").resolve() == worker_dir / "runs"
    print(f"git deployment: flow run created to Completed in {took:.0f} s; damptune imported "
          f"from {sorted(imported)}")
