"""What a trial's MLflow run costs, in requests and CPU, against a real ``mlflow server``.

It starts a local MLflow server as the stack does (``mlflow server``, one worker, a SQLite
store, bound to 127.0.0.1), trains one MNIST-1D MLP run for a history, then logs trials
through the grid's logger (``tasks.trial_logger.MlflowTrialLogger``: open with a warm-start
tag, the update and evaluation records, finish; no plots, no system metrics) in two ways,
alternated: **now**, and **before** ``e33afc0``, which made two requests more per trial (a new
run reopened as RUNNING, and the state tag sent alone, not with the final metrics), replayed
here as those two calls. Per trial it prints the requests to the server (counted in MLflow's
REST store), the CPU of this process while logging and the CPU of the server's process tree;
then the ratio of the two ways' CPU per trial (client and server together).

No goal: it says what each request of a trial costs the 2 cores.
Run: ``python bench/mlflow_requests.py [--trials 20]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_server(root: str) -> tuple[subprocess.Popen[bytes], str]:
    """A local MLflow server on a free port of 127.0.0.1; (its process, its URI)."""
    from infra.stack import HOST, free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--artifacts-destination", f"{root}/mlartifacts"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc, uri
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the MLflow server at {uri} did not answer within 120 s")


def counted_requests() -> collections.Counter[str]:
    """Count the requests of MLflow's REST tracking store, by endpoint."""
    from mlflow.store.tracking.rest_store import RestStore

    counts: collections.Counter[str] = collections.Counter()
    real = RestStore._call_endpoint

    def call(self: Any, api: Any, *args: Any, **kwargs: Any) -> Any:
        counts[api.__name__] += 1
        return real(self, api, *args, **kwargs)

    RestStore._call_endpoint = call  # type: ignore[method-assign]
    return counts


def one_trial(client: Any, exp_id: str, parent: str, number: int, state: Any,
              before: bool) -> None:
    """Log one trial as the grid does; ``before``: with the two requests it made before."""
    from damptune.records import record_from_dict
    from tasks import tracking
    from tasks.results import TrialResult, TrialState
    from tasks.trial_logger import MlflowTrialLogger

    logger = MlflowTrialLogger(client, None, metrics_every=5, target=0.6)
    run_id = logger.open(exp_id, parent_run_id=parent, cell_key="n2/geodamp/mlp", number=number,
                         params={"factor": 2.0, "delay": 3}, seeded_from="n1/geodamp/mlp#0")
    if before:
        client.update_run(run_id, status="RUNNING")
    for record in state.history:
        logger(record_from_dict(record))
    if before:
        tracking.set_tags(client, run_id, {"damptune.state": "COMPLETE"})
    logger.finish(TrialResult(number, TrialState.COMPLETE, {}, value=1.0), state,
                  {"attempts": 1, "lost_updates": 0, "lost_seconds": 0.0})


def history() -> Any:
    """A grid-like trial: MNIST-1D MLP, 2 epochs, dense evaluations near its accuracy."""
    from damptune import TrainConfig, TrainData, train
    from models import load_dataset

    ds = load_dataset("mnist1d", seed=0)
    return train(TrainConfig(
        module="models.mlp:MLP", module_kwargs={"input_shape": (40,), "n_classes": 10},
        optimizer_kwargs={"momentum": 0.9}, lr=0.05, max_epochs=2, eval_resolution=0.02,
        compute_per_example=2e-5, compute_fixed=1e-4, compute_forward_per_example=7e-6,
        compute_forward_fixed=5e-5, compute_norm=2e-5, seed=0),
        TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test))


def main(argv: list[str] | None = None) -> int:
    import psutil
    from mlflow.tracking import MlflowClient

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="trials of each way")
    args = parser.parse_args(argv)
    state = history()
    with tempfile.TemporaryDirectory() as root:
        proc, uri = start_server(root)
        try:
            server = psutil.Process(proc.pid)
            client = MlflowClient(uri)
            exp_id = client.create_experiment("requests")
            parent = client.create_run(exp_id).info.run_id
            counts = counted_requests()
            totals = measure(client, exp_id, parent, state, server, counts, args.trials)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    report(totals, args.trials)
    return 0


def measure(client: Any, exp_id: str, parent: str, state: Any, server: Any,
            counts: collections.Counter[str], trials: int) -> dict[bool, list[float]]:
    """[requests, client CPU s, server CPU s] summed over ``trials`` trials of each way."""
    def server_cpu() -> float:
        procs = [server, *server.children(recursive=True)]
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    totals = {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]}
    for i in range(2 * trials):
        before = i % 2 == 1
        counts.clear()
        c0, s0 = time.process_time(), server_cpu()
        one_trial(client, exp_id, parent, i, state, before)
        c1, s1 = time.process_time(), server_cpu()
        for k, v in enumerate((sum(counts.values()), c1 - c0, s1 - s0)):
            totals[before][k] += v
    return totals


def report(totals: dict[bool, list[float]], trials: int) -> None:
    for before in (True, False):
        requests, client, server = (v / trials for v in totals[before])
        print(f"{'before e33afc0' if before else 'now':>14}: {requests:.1f} requests per trial, "
              f"client CPU {client * 1e3:.0f} ms, server CPU {server * 1e3:.0f} ms", flush=True)
    ratio = sum(totals[False][1:]) / sum(totals[True][1:])
    print(f"CPU per trial, now / before (client and server): {ratio:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
