"""The local stack (infra.stack): real Prefect and MLflow servers on free ports of 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from infra.stack import (
    REPO_ROOT,
    SERVICES,
    StackError,
    StackPaths,
    _spawn,
    down,
    free_port,
    running_stack,
    status,
    up,
)


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory):
    """A run directory and two free ports; whatever runs there is stopped after the module."""
    run_dir = tmp_path_factory.mktemp("stack")
    ports = {"prefect_port": free_port(), "mlflow_port": free_port()}
    yield run_dir, ports
    down(run_dir)


@pytest.fixture
def stack(stack_dir):
    """The module's stack, started by the first test that needs it (any order works)."""
    run_dir, ports = stack_dir
    return up(run_dir, **ports)


@pytest.mark.slow
def test_stack_up_answers_health_checks(stack):
    assert _get(f"{stack.prefect_api_url}/health") == (200, b"true")
    assert _get(f"{stack.mlflow_uri}/health") == (200, b"OK")
    pools = _get(f"{stack.prefect_api_url}/work_pools/damptune")
    assert pools[0] == 200 and b'"type":"process"' in pools[1].replace(b" ", b"")
    for name in SERVICES:
        assert (stack.run_dir / "pids" / f"{name}.pid").is_file()
        assert (stack.run_dir / "logs" / f"{name}.log").is_file()
    assert (stack.run_dir / "prefect.db").is_file()
    assert (stack.run_dir / "mlflow.db").is_file()


@pytest.mark.slow
def test_the_mlflow_servers_store_is_in_wal_mode_and_holds_what_it_is_sent(stack):
    from mlflow.tracking import MlflowClient

    name = f"wal-{time.time_ns()}"
    MlflowClient(stack.mlflow_uri).create_experiment(name)
    with sqlite3.connect(stack.run_dir / "mlflow.db") as db:  # read beside the live server
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert (name,) in db.execute("select name from experiments").fetchall()


@pytest.mark.slow
def test_stack_status_reports_each_service_alive_and_healthy(stack):
    rows = status(stack.run_dir)
    assert [row.name for row in rows] == list(SERVICES)
    assert all(row.alive and row.healthy for row in rows), rows
    result = subprocess.run(
        [sys.executable, "-m", "infra.stack", "status", "--run-dir", str(stack.run_dir)],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("healthy") == 3


@pytest.mark.slow
def test_stack_env_file_exports_client_settings(stack):
    lines = (stack.run_dir / "stack.env").read_text().splitlines()
    assert f"export PREFECT_API_URL={stack.prefect_api_url}" in lines
    assert f"export MLFLOW_TRACKING_URI={stack.mlflow_uri}" in lines
    assert "export PREFECT_SERVER_ANALYTICS_ENABLED=false" in lines
    assert "export MLFLOW_DISABLE_TELEMETRY=true" in lines


@pytest.mark.slow
def test_stack_up_twice_reuses_running_services(stack):
    pids = {row.name: row.pid for row in status(stack.run_dir)}
    again = up(stack.run_dir, prefect_port=stack.prefect_port, mlflow_port=stack.mlflow_port)
    assert again.started == ()
    assert set(again.reused) == set(SERVICES)
    assert {row.name: row.pid for row in status(stack.run_dir)} == pids


@pytest.mark.slow
def test_a_server_that_answers_late_during_up_is_kept(stack, monkeypatch):
    """The MLflow server's processes are stopped (SIGSTOP) while ``up`` checks the stack, as a
    server busy on a loaded machine is slow to answer: they go on (SIGCONT) only once a health
    check has found the server not answering, so a later check passes, and ``up`` keeps it,
    same PID, instead of replacing it."""
    import infra.stack

    checks, real_check = [], infra.stack._http_ok
    pids = {row.name: row.pid for row in status(stack.run_dir)}
    stopped = [pids["mlflow"]]  # its process group, while it is stopped

    def spy(url, expected, **kw):
        ok = real_check(url, expected, **kw)
        checks.append((url, ok))
        if url == f"{stack.mlflow_uri}/health" and not ok and stopped:
            os.killpg(stopped.pop(), signal.SIGCONT)  # seen down: it answers from now on
        return ok

    monkeypatch.setattr(infra.stack, "_http_ok", spy)
    os.killpg(pids["mlflow"], signal.SIGSTOP)
    try:
        again = up(stack.run_dir, prefect_port=stack.prefect_port, mlflow_port=stack.mlflow_port)
    finally:
        if stopped:  # never seen down: let it go on all the same
            os.killpg(stopped.pop(), signal.SIGCONT)
    mlflow_checks = [ok for url, ok in checks if url == f"{stack.mlflow_uri}/health"]
    assert mlflow_checks[0] is False and True in mlflow_checks, checks  # late, then answered
    assert again.started == () and set(again.reused) == set(SERVICES)
    assert {row.name: row.pid for row in status(stack.run_dir)} == pids


def _listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) on which the process ``pid`` or any of its descendants listens:
    TCP sockets in LISTEN, and UDP sockets bound with no peer, IPv4 and IPv6."""
    root = psutil.Process(pid)
    out = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            sockets = proc.net_connections(kind="inet")
        except psutil.NoSuchProcess:  # a child that ended meanwhile listens on nothing
            continue
        out |= {(c.laddr.ip, c.laddr.port) for c in sockets if c.laddr and (
            c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr))}
    return out


@pytest.mark.slow
def test_every_stack_service_listens_on_127_0_0_1_only(stack):
    """The promise that the stack's servers bind to 127.0.0.1: read from the kernel's sockets
    of each service's processes (its PID file's process and its children), never from the
    command line that asked for it. Each server listens on its port there, and no process of
    the stack listens on any other address (0.0.0.0, ::, a network interface's)."""
    listening = {row.name: _listening(row.pid) for row in status(stack.run_dir)}
    assert set(listening) == set(SERVICES)
    elsewhere = {name: sorted(a for a in found if a[0] != "127.0.0.1")
                 for name, found in listening.items()}
    assert not any(elsewhere.values()), elsewhere
    assert ("127.0.0.1", stack.prefect_port) in listening["prefect-server"], listening
    assert ("127.0.0.1", stack.mlflow_port) in listening["mlflow"], listening


@pytest.mark.slow
def test_stack_up_on_other_ports_of_a_running_stack_is_refused(stack):
    with pytest.raises(StackError, match="stop it first"):
        up(stack.run_dir, prefect_port=free_port(), mlflow_port=stack.mlflow_port)


def _post(url: str, payload: dict, attempts: int = 4) -> dict:
    """POST JSON; a 503 (the server's SQLite busy under load: seen once in a full run) is
    tried again, a bounded number of times."""
    for attempt in range(attempts):
        request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or attempt == attempts - 1:
                raise
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


@pytest.mark.slow
def test_stack_down_marks_in_flight_runs_of_the_worker_crashed(stack):
    api = stack.prefect_api_url
    flow = _post(f"{api}/flows/", {"name": "stack-test"})
    deployment = _post(f"{api}/deployments/", {
        "name": "orphan", "flow_id": flow["id"], "work_pool_name": "damptune",
        "entrypoint": "nowhere.py:nothing"})
    run = _post(f"{api}/deployments/{deployment['id']}/create_flow_run",
                {"state": {"type": "RUNNING", "name": "Running"}})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    patch = json.dumps({"infrastructure_pid": str(dead.pid)}).encode()  # its process is gone
    request = urllib.request.Request(f"{api}/flow_runs/{run['id']}", method="PATCH", data=patch,
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()

    assert down(stack.run_dir, services=("prefect-worker",)) == ["prefect-worker"]

    state = json.loads(_get(f"{api}/flow_runs/{run['id']}")[1])["state"]
    assert state["type"] == "CRASHED" and "infra.stack down" in state["message"]


@pytest.mark.slow
def test_stack_down_stops_every_process_and_frees_ports(stack):
    family = []
    for row in status(stack.run_dir):
        proc = psutil.Process(row.pid)
        family += [proc, *proc.children(recursive=True)]
    assert len(family) >= 3

    stopped = down(stack.run_dir)

    assert stopped == list(SERVICES)  # worker first, then the Prefect server, then MLflow
    assert [p.pid for p in family if p.is_running() and p.status() != "zombie"] == []
    assert _port_free(stack.prefect_port) and _port_free(stack.mlflow_port)
    assert list((stack.run_dir / "pids").iterdir()) == []
    assert not (stack.run_dir / "stack.env").exists()
    assert all(not row.alive for row in status(stack.run_dir))


def test_stack_up_names_the_port_taken_by_another_listener(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        with pytest.raises(StackError, match=rf"port {taken} .*Prefect server.*--prefect-port"):
            up(tmp_path, prefect_port=taken, mlflow_port=free_port())
        with pytest.raises(StackError, match=rf"port {taken} .*MLflow server.*--mlflow-port"):
            up(tmp_path, prefect_port=free_port(), mlflow_port=taken)
    assert list((tmp_path / "pids").glob("*.pid")) == []  # nothing was started


def test_stack_down_without_a_stack_stops_nothing(tmp_path):
    assert down(tmp_path) == []


def test_stack_status_flags_a_stale_pid_file(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "mlflow.pid").write_text(f"{dead.pid}\n")
    row = {row.name: row for row in status(tmp_path)}["mlflow"]
    assert (row.pid, row.alive, row.healthy, row.detail) == (dead.pid, False, False,
                                                             "stale PID file")


def test_stack_running_stack_stops_only_what_it_started(tmp_path, monkeypatch):
    import infra.stack as stack_module

    calls = {}
    started = stack_module.Stack(Path(tmp_path), 1, 2, started=("mlflow",),
                                 reused=("prefect-worker", "prefect-server"))
    monkeypatch.setattr(stack_module, "up", lambda *a, **k: started)
    monkeypatch.setattr(stack_module, "down",
                        lambda run_dir, services: calls.setdefault("down", services))
    with pytest.raises(RuntimeError), running_stack(tmp_path, prefect_port=1, mlflow_port=2):
        raise RuntimeError("the body failed")
    assert calls["down"] == ("mlflow",)


def test_stack_env_command_prints_export_lines(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "infra.stack", "env", "--run-dir", str(tmp_path),
         "--prefect-port", "4999", "--mlflow-port", "5999"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "export PREFECT_API_URL=http://127.0.0.1:4999/api",
        "export MLFLOW_TRACKING_URI=http://127.0.0.1:5999",
        "export PREFECT_SERVER_ANALYTICS_ENABLED=false",
        "export MLFLOW_DISABLE_TELEMETRY=true",
    ]


def test_stack_down_command_kills_a_service_that_ignores_sigterm_after_its_stop_timeout(
        tmp_path):
    """`make stack-down` (`infra.stack down`) waits ``--stop-timeout`` (20 s unless given) for
    a service to stop on SIGTERM, then SIGKILLs it and says so; it used to wait the health
    timeout of `up` (180 s) per service."""
    import threading

    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(600)", "mlflow"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    threading.Thread(target=stubborn.wait, daemon=True).start()  # reaps it when it dies
    assert stubborn.stdout.readline().strip() == "ready"
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "mlflow.pid").write_text(f"{stubborn.pid}\n")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "infra.stack", "down", "--run-dir", str(tmp_path),
             "--stop-timeout", "1"],
            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        assert result.returncode == 0, result.stderr
        assert (f"mlflow: processes [{stubborn.pid}] did not stop within 1 s of SIGTERM; "
                "SIGKILLed") in result.stdout, result.stdout
        assert "stopped: mlflow" in result.stdout, result.stdout
        assert stubborn.wait(timeout=10) == -9
    finally:
        if stubborn.poll() is None:
            stubborn.kill()


def test_a_service_started_where_sigint_is_ignored_still_stops_on_sigint(tmp_path):
    """A shell without job control (a script, `nohup make run &`) starts a `&` command with
    SIGINT ignored. The stack's services must not inherit that: Prefect's worker stops on
    SIGTERM by sending itself SIGINT, which an inherited SIG_IGN swallowed, so the worker
    polled on until `make stack-down` SIGKILLed it 20 s later. A service here is an asyncio
    program, as the worker is: SIGINT must end its ``asyncio.run``."""
    code = ("import asyncio\nasync def main():\n    print('up', 'and', 'waiting', flush=True)\n"
            "    await asyncio.sleep(600)\nasyncio.run(main())")
    paths = StackPaths(tmp_path)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `&` in a script leaves it
    try:
        proc = _spawn(paths, "probe", [sys.executable, "-c", code], env=os.environ, cwd=tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        deadline = time.monotonic() + 60
        while "up and waiting" not in paths.log_file("probe").read_text():
            assert time.monotonic() < deadline, paths.log_file("probe").read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)  # psutil.TimeoutExpired if SIGINT was ignored
        assert "KeyboardInterrupt" in paths.log_file("probe").read_text()
    finally:
        if proc.is_running():
            proc.kill()


def test_free_port_is_free_and_outside_the_ports_the_kernel_hands_out():
    """The ports a stack's servers bind seconds after free_port named them: never in the
    ephemeral range, where a Dask process's port 0 (or an outgoing connection) could take one
    first (CI saw a health check read from Dask); free, and not the same one every time."""
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
                 .split())
    ports = [free_port() for _ in range(20)]
    assert not [p for p in ports if low <= p <= high], (ports, low, high)
    assert all(_port_free(p) for p in ports) and len(set(ports)) > 1, ports
