"""The main job: stack up → deploy → run ``tune/<grid>`` → wait → report → UI addresses.

::

    python -m infra.main [--grid grid] [--param key=json ...] [--run-dir runs/stack]
                         [--timeout SECONDS] [--prefect-port 4200] [--mlflow-port 5000]

1. ``python -m infra.stack up``: the local Prefect server, work pool ``damptune`` and worker,
   and MLflow server (reused when they are already running and healthy);
2. ``prefect --no-prompt deploy --all`` from the repository root (``prefect.yaml``);
3. creates a flow run of deployment ``tune/<grid>`` through Prefect's Python client, with
   ``--param key=value ...`` (values are JSON, as for the Prefect CLI:
   ``--param networks=[2,4] --param trials=8``);
4. waits for it with Prefect's ``wait_for_flow_run``, showing the grid's progress live (cells
   and trials done, the held-out stage, time elapsed and left: :mod:`infra.progress`);
5. ``python -m damptune report --run-dir <the flow's run_dir>`` (the ``run_dir`` parameter,
   else ``runs/<grid_name>``, relative to the repository root);
6. prints the Prefect and MLflow UI addresses.

Before anything starts, ``--grid`` and the ``--param`` values are checked with the flow's own
validators (:func:`check_parameters`, on the deployment's parameters in ``prefect.yaml`` with
the ``--param`` values over them): a bad one is refused naming the parameter, the value given
and what is accepted, and no server, flow run or run directory is made.

The stack keeps running afterwards (``make stack-down`` stops it). Exit status: 0 when the
flow run COMPLETED and the report printed; 2 for bad input (as ``damptune tune``), refused
before any work; 1 when the stack failed or the run did not complete; 124 when ``--timeout``
ran out and 130 on Ctrl-C (the flow run goes on in both).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote
from uuid import UUID

import yaml

from damptune.errors import ConfigError
from infra.prefect_api import read_flow_run, recent_logs, run_deployment, wait_for_flow_run
from infra.progress import GridWatch, expected_cells
from infra.stack import (
    DEFAULT_MLFLOW_PORT,
    DEFAULT_PREFECT_PORT,
    DEFAULT_RUN_DIR,
    REPO_ROOT,
    Stack,
    StackError,
    base_env,
    read_state,
    up,
)

__all__ = ["main", "wait_for_flow_run", "experiment_url", "deployment_parameters",
           "check_parameters", "flow_parameters", "EXIT_USAGE"]

PREFECT_FILE = REPO_ROOT / "prefect.yaml"
EXIT_USAGE = 2  # bad input, refused before any work (as `damptune tune`)
EXIT_TIMEOUT = 124  # --timeout ran out (as timeout(1)); the flow run goes on
EXIT_INTERRUPTED = 130  # Ctrl-C while waiting; the flow run goes on

def _say(line: str) -> None:
    print(line, flush=True)


def _print_run_logs(stack: Stack, flow_run_id: UUID, n: int = 40) -> None:
    try:
        logs = recent_logs(stack.prefect_api_url, flow_run_id, n)
    except Exception as exc:  # noqa: BLE001 - the logs are a convenience
        _say(f"(could not read the flow run's logs: {exc})")
        return
    _say(f"last {len(logs)} log lines of the flow run:")
    for log in logs:
        _say(f"  {str(log.get('timestamp', ''))[11:19]} {log.get('message', '')}")


def _mlflow_experiment_url(stack: Stack, grid_name: str) -> str | None:
    from mlflow.tracking import MlflowClient

    try:
        exp = MlflowClient(tracking_uri=stack.mlflow_uri).get_experiment_by_name(
            f"damptune-{grid_name}")
    except Exception:  # noqa: BLE001 - the address is a convenience
        return None
    return None if exp is None else experiment_url(stack.mlflow_uri, exp.experiment_id)


def experiment_url(mlflow_uri: str, experiment_id: str) -> str:
    """The experiment's runs in MLflow's UI, best objective first. MLflow 3.17 keeps a
    GenAI/model-training switch per browser, GenAI (traces) by default; ``workflowType`` in the
    address selects model training. The runs table's columns are kept per browser too (local
    storage): the address can only set the order (``orderByKey``, ``orderByAsc``)."""
    order = quote("metrics.`objective`")
    return (f"{mlflow_uri}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&orderByKey={order}&orderByAsc=true")


def _param_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m infra.main", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="grid",
                        help="deployment of flow `tune` to run (%(default)s, or smoke)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                        help="override a flow parameter (repeatable), e.g. trials=4")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                        help="the stack's run directory (%(default)s)")
    parser.add_argument("--prefect-port", type=int, default=None,
                        help=f"default {DEFAULT_PREFECT_PORT}, or the running stack's")
    parser.add_argument("--mlflow-port", type=int, default=None,
                        help=f"default {DEFAULT_MLFLOW_PORT}, or the running stack's")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds to wait for the flow run (default: until it ends)")
    parser.add_argument("--no-deploy", action="store_true",
                        help="skip `prefect deploy --all` (the deployments exist already)")
    args = parser.parse_args(argv)
    return args, flow_parameters(args.param)


def flow_parameters(items: list[str]) -> dict[str, Any]:
    """The ``--param NAME=JSON`` items as a dict (a value that is no JSON is taken as a
    string); ``ConfigError`` for an item without ``NAME=``."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError("--param", item, "NAME=JSON, e.g. trials=4 or networks=[2,4]")
        params[key] = _param_value(raw)
    return params


def deployment_parameters(name: str, prefect_file: Path = PREFECT_FILE) -> dict[str, Any]:
    """The parameters deployment ``name`` of ``prefect_file`` gives flow ``tune``;
    ``ConfigError`` (``--grid``) if the file has no such deployment."""
    deployments = yaml.safe_load(prefect_file.read_text()).get("deployments") or []
    for deployment in deployments:
        if deployment.get("name") == name:
            return dict(deployment.get("parameters") or {})
    raise ConfigError("--grid", name, f"a deployment of {prefect_file.name}: "
                      f"{', '.join(str(d.get('name')) for d in deployments)}")


def check_parameters(params: dict[str, Any]) -> None:
    """``params`` of flow ``tune`` checked as its deployment's run would check them, before
    anything starts: a name that is no parameter of the flow; the flow's own validators
    (:func:`flows.tune.grid_of`), paths (``run_dir``, ``cluster``, ``data_root``) taken
    relative to the repository root (the deployments' working directory); the parameter
    schema Prefect's server enforces (a value of the wrong type). Raises ``ConfigError`` (or
    a validator's ``ValueError``) naming the parameter; writes nothing."""
    from flows.signature import flow_params
    from flows.tune import grid_of

    names = [p.name for p in flow_params()]
    for key, value in params.items():
        if key not in names:
            raise ConfigError(key, value, f"a parameter of flow tune: {', '.join(names)}")
    try:
        with contextlib.chdir(REPO_ROOT):
            grid_of(params)
    except TypeError:  # a value of a type the validators do not expect: the schema names it
        _check_schema(params)
        raise
    _check_schema(params)


def _check_schema(params: dict[str, Any]) -> None:
    """``params`` against flow ``tune``'s parameter schema, as Prefect's server checks a
    deployment's run (it refuses ``warm_start="yes"``, which the validators never see)."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    from flows.tune import tune

    schema = parameter_schema(tune).model_dump_for_openapi()
    for error in validate(params, schema, ignore_required=True):
        key = error.json_path.removeprefix("$.").split(".")[0].split("[")[0]
        prop = schema["properties"].get(key, {})
        types = " or ".join(str(t.get("type")) for t in prop.get("anyOf", [prop]))
        raise ConfigError(key, params.get(key), f"{types} ({prop.get('description', '')}); "
                          f"the flow's parameter schema says: {error.message}")


def _check(args: argparse.Namespace, params: dict[str, Any]) -> None:
    """The run's parameters (``--grid``'s deployment in prefect.yaml, ``params`` over them)
    checked before anything starts; with ``--no-deploy`` a deployment that is not in
    prefect.yaml (registered from elsewhere) has only its ``--param`` values checked."""
    try:
        deployed = deployment_parameters(args.grid)
    except ConfigError:
        if not args.no_deploy:
            raise
        deployed = {}
    check_parameters({**deployed, **params})


def _start(args: argparse.Namespace) -> Stack:
    """The stack up (reused where healthy), and ``prefect deploy --all`` unless told not to."""
    state = read_state(args.run_dir)
    stack = up(args.run_dir,
               prefect_port=args.prefect_port or state.get("prefect_port", DEFAULT_PREFECT_PORT),
               mlflow_port=args.mlflow_port or state.get("mlflow_port", DEFAULT_MLFLOW_PORT),
               progress=_say)
    if stack.reused:
        _say(f"stack: reusing {', '.join(stack.reused)}")
    if not args.no_deploy:
        _say("$ prefect --no-prompt deploy --all")
        env = {**base_env(), **stack.env, "PWD": str(REPO_ROOT)}  # prefect.yaml: {{ $PWD }}
        deployed = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy",
                                   "--all"], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)
        if deployed.returncode != 0:
            raise StackError(f"`prefect deploy --all` exited {deployed.returncode}")
    return stack


def _run_and_wait(stack: Stack, args: argparse.Namespace,
                  params: dict[str, Any]) -> tuple[UUID, dict[str, Any]]:
    """Run deployment ``tune/<grid>``; wait for it to end, the grid's progress shown live;
    (its id, the flow run)."""
    _say(f"run deployment tune/{args.grid}" + (f" with {json.dumps(params)}" if params else ""))
    flow_run_id = run_deployment(stack.prefect_api_url, f"tune/{args.grid}", params)
    _say(f"flow run {flow_run_id}: {stack.prefect_ui_url}/runs/flow-run/{flow_run_id}")
    with _watch(stack, flow_run_id):
        run = wait_for_flow_run(stack.prefect_api_url, flow_run_id, timeout_s=args.timeout)
    return flow_run_id, run


def _watch(stack: Stack, flow_run_id: UUID) -> contextlib.AbstractContextManager[Any]:
    """The grid's live progress (:class:`infra.progress.GridWatch`) from the flow run's
    parameters; nothing where they name no grid this process can read."""
    params = read_flow_run(stack.prefect_api_url, flow_run_id).get("parameters") or {}
    try:
        storage, grid_name, expected = expected_cells(params, REPO_ROOT)
    except Exception as exc:  # noqa: BLE001 - the flow run reports bad parameters itself
        _say(f"(no progress line: {exc})")
        return contextlib.nullcontext()
    return GridWatch(storage, grid_name, expected)


def _report(stack: Stack, run: dict[str, Any], grid: str) -> tuple[str, int]:
    """``damptune report`` of the flow run's run directory; (grid name, its exit status)."""
    flow_params = run.get("parameters") or {}
    grid_name = flow_params.get("grid_name") or grid
    run_dir = flow_params.get("run_dir") or f"runs/{grid_name}"
    run_dir_path = Path(run_dir) if Path(run_dir).is_absolute() else REPO_ROOT / run_dir
    if not run_dir_path.exists():
        _say(f"(no run directory {run_dir_path}: nothing to report)")
        return grid_name, 0
    _say(f"$ python -m damptune report --run-dir {run_dir}")
    return grid_name, subprocess.run(
        [sys.executable, "-m", "damptune", "report", "--run-dir", str(run_dir_path)],
        cwd=REPO_ROOT, env={**base_env(), **stack.env}, stdin=subprocess.DEVNULL,
    ).returncode


def main(argv: list[str] | None = None) -> int:
    try:
        args, params = _parse(argv)
        _check(args, params)  # bad input: refused before any server or flow run starts
    except ValueError as exc:  # ConfigError is one; a fault of a cluster or store is not
        print(f"python -m infra.main: error: {exc} Nothing was started.", file=sys.stderr)
        return EXIT_USAGE
    t0 = time.monotonic()
    try:
        stack = _start(args)
        flow_run_id, run = _run_and_wait(stack, args, params)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (TimeoutError, KeyboardInterrupt) as exc:
        print(f"\nstopped waiting ({exc or 'interrupted'}); the flow run goes on; cancel it "
              "with: prefect flow-run cancel <id>", file=sys.stderr)
        return EXIT_TIMEOUT if isinstance(exc, TimeoutError) else EXIT_INTERRUPTED
    run_url = f"{stack.prefect_ui_url}/runs/flow-run/{flow_run_id}"
    final = run["state"]["type"]
    _say(f"flow run {run.get('name')} ({flow_run_id}) finished {run['state']['name']} in "
         f"{time.monotonic() - t0:.0f} s (including stack and deploy)")
    if final != "COMPLETED":
        _print_run_logs(stack, flow_run_id)
    grid_name, report_rc = _report(stack, run, args.grid)
    experiment_url = _mlflow_experiment_url(stack, grid_name)
    _say("")
    _say(f"Prefect UI: {stack.prefect_ui_url}  (this run: {run_url})")
    _say(f"MLflow UI:  {stack.mlflow_uri}"
         + (f"  (experiment damptune-{grid_name}: {experiment_url})" if experiment_url else ""))
    _say(f"the stack keeps running; stop it with: make stack-down "
         f"(python -m infra.stack down --run-dir {args.run_dir})")
    return 0 if final == "COMPLETED" and report_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
