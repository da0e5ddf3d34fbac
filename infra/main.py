"""The main job: stack up → deploy → run ``tune/<grid>`` → wait → report → UI addresses.

::

    python -m infra.main [--grid grid] [--param key=json ...] [--run-dir runs/stack]
                         [--timeout SECONDS] [--prefect-port 4200] [--mlflow-port 5000]

1. ``python -m infra.stack up``: the local Prefect server, work pool ``damptune`` and worker,
   and MLflow server (reused when they are already running and healthy);
2. ``prefect --no-prompt deploy --all`` from the repository root (``prefect.yaml``);
3. ``prefect deployment run tune/<grid> --param key=value ...`` (values are JSON, as for the
   Prefect CLI: ``--param networks=[2,4] --param trials=8``);
4. polls the Prefect API until the flow run is in a final state, printing each new state;
5. ``python -m damptune report --run-dir <the flow's run_dir>`` (the ``run_dir`` parameter,
   else ``runs/<grid_name>``, relative to the repository root);
6. prints the Prefect and MLflow UI addresses.

The stack keeps running afterwards (``make stack-down`` stops it). The exit status is 0 only
when the flow run COMPLETED and the report printed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from infra.stack import (
    DEFAULT_MLFLOW_PORT,
    DEFAULT_PREFECT_PORT,
    DEFAULT_RUN_DIR,
    REPO_ROOT,
    Stack,
    StackError,
    _base_env,
    _http,
    _Paths,
    _read_state,
    up,
)

__all__ = ["main", "wait_for_flow_run"]

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _say(line: str) -> None:
    print(line, flush=True)


def _prefect(stack: Stack, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    """Run the Prefect CLI against the stack, from the repository root."""
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", *args]
    _say(f"$ prefect --no-prompt {' '.join(args)}")
    env = {**_base_env(), **stack.env, "PWD": str(REPO_ROOT)}  # prefect.yaml: {{ $PWD }}
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=capture, text=True)


def _get_json(url: str, *, data: dict | None = None):
    code, body = _http(url, data=None if data is None else json.dumps(data).encode(),
                       timeout_s=10)
    if code != 200:
        raise StackError(f"{url} answered {code or 'nothing'}: {body[:300]!r}")
    return json.loads(body)


def wait_for_flow_run(api_url: str, flow_run_id: str, *, timeout_s: float | None = None,
                      poll_s: float = 2.0, on_state=None) -> dict:
    """Poll ``GET /flow_runs/{id}`` until its state is final; return the flow run.

    Args:
        api_url: the Prefect API, e.g. ``http://127.0.0.1:4200/api``.
        flow_run_id: the flow run's UUID.
        timeout_s: give up after this many seconds (``None``: wait as long as it takes).
        poll_s: seconds between polls.
        on_state: called with ``(flow_run, elapsed_s)`` each time the state changes.

    Raises:
        TimeoutError: the run was not in a final state after ``timeout_s``.
    """
    t0 = time.monotonic()
    last = None
    while True:
        run = _get_json(f"{api_url}/flow_runs/{flow_run_id}")
        state = run.get("state") or {}
        key = (state.get("type"), state.get("name"))
        if key != last:
            last = key
            if on_state is not None:
                on_state(run, time.monotonic() - t0)
        if state.get("type") in FINAL_STATES:
            return run
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"flow run {flow_run_id} is still {state.get('name')} after "
                               f"{timeout_s:.0f} s")
        time.sleep(poll_s)


def _print_run_logs(stack: Stack, flow_run_id: str, n: int = 40) -> None:
    try:
        logs = _get_json(f"{stack.prefect_api_url}/logs/filter", data={
            "logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_DESC",
            "limit": n})
    except StackError as exc:
        _say(f"(could not read the flow run's logs: {exc})")
        return
    _say(f"last {len(logs)} log lines of the flow run:")
    for log in reversed(logs):
        _say(f"  {log.get('timestamp', '')[11:19]} {log.get('message', '')}")


def _mlflow_experiment_url(stack: Stack, grid_name: str) -> str | None:
    name = urllib.parse.quote(f"damptune-{grid_name}")
    code, body = _http(f"{stack.mlflow_uri}/api/2.0/mlflow/experiments/get-by-name"
                       f"?experiment_name={name}")
    if code != 200:
        return None
    exp_id = json.loads(body)["experiment"]["experiment_id"]
    return f"{stack.mlflow_uri}/#/experiments/{exp_id}/runs"


def _param_value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def main(argv: list[str] | None = None) -> int:
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
    params = {}
    for item in args.param:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            parser.error(f"--param takes KEY=VALUE (VALUE in JSON), got {item!r}")
        params[key] = raw

    t0 = time.monotonic()
    state = _read_state(_Paths(args.run_dir))
    try:
        stack = up(args.run_dir,
                   prefect_port=args.prefect_port or state.get("prefect_port",
                                                                DEFAULT_PREFECT_PORT),
                   mlflow_port=args.mlflow_port or state.get("mlflow_port", DEFAULT_MLFLOW_PORT),
                   progress=_say)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if stack.reused:
        _say(f"stack: reusing {', '.join(stack.reused)}")

    if not args.no_deploy:
        deployed = _prefect(stack, "deploy", "--all")
        if deployed.returncode != 0:
            print(f"error: `prefect deploy --all` exited {deployed.returncode}", file=sys.stderr)
            return 1

    run_args = ["deployment", "run", f"tune/{args.grid}"]
    for key, raw in params.items():
        run_args += ["--param", f"{key}={raw}"]
    created = _prefect(stack, *run_args, capture=True)
    sys.stdout.write(created.stdout)
    sys.stderr.write(created.stderr)
    match = _UUID.search(created.stdout)
    if created.returncode != 0 or match is None:
        print(f"error: `prefect deployment run tune/{args.grid}` exited {created.returncode}"
              " without a flow run id", file=sys.stderr)
        return 1
    flow_run_id = match.group(0)
    run_url = f"{stack.prefect_ui_url}/runs/flow-run/{flow_run_id}"
    _say(f"flow run {flow_run_id}: {run_url}")

    def on_state(run: dict, elapsed: float) -> None:
        state = run.get("state") or {}
        _say(f"[{elapsed:7.1f} s] {run.get('name')}: {state.get('name')}"
             + (f" — {state['message']}" if state.get("message") else ""))

    try:
        run = wait_for_flow_run(stack.prefect_api_url, flow_run_id, timeout_s=args.timeout,
                                on_state=on_state)
    except (TimeoutError, KeyboardInterrupt) as exc:
        print(f"\nstopped waiting ({exc or 'interrupted'}); the flow run goes on: {run_url}\n"
              f"cancel it with: prefect flow-run cancel {flow_run_id}", file=sys.stderr)
        return 2
    final = run["state"]["type"]
    _say(f"flow run {run.get('name')} ({flow_run_id}) finished {run['state']['name']} in "
         f"{time.monotonic() - t0:.0f} s (including stack and deploy)")
    if final != "COMPLETED":
        _print_run_logs(stack, flow_run_id)

    flow_params = run.get("parameters") or {}
    grid_name = flow_params.get("grid_name") or args.grid
    run_dir = flow_params.get("run_dir") or (
        _param_value(params["run_dir"]) if "run_dir" in params else f"runs/{grid_name}")
    run_dir_path = Path(run_dir) if Path(run_dir).is_absolute() else REPO_ROOT / run_dir
    report_rc = 0
    if run_dir_path.exists():
        _say(f"$ python -m damptune report --run-dir {run_dir}")
        report_rc = subprocess.run(
            [sys.executable, "-m", "damptune", "report", "--run-dir", str(run_dir_path)],
            cwd=REPO_ROOT, env={**_base_env(), **stack.env}, stdin=subprocess.DEVNULL,
        ).returncode
    else:
        _say(f"(no run directory {run_dir_path}: nothing to report)")

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
