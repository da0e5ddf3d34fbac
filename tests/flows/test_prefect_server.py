"""The temporary Prefect server of a `damptune tune` run that names no PREFECT_API_URL: in a
session of its own (a signal to the run's process group does not stop it under the run), and
never left behind by a run that died without stopping it."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

pytestmark = pytest.mark.slow

RUN = """
import sys, time
from flows.prefect_server import temporary_prefect_server
from prefect.client.orchestration import get_client
with temporary_prefect_server(sys.argv[1]) as url:
    with get_client(sync_client=True) as client:  # Prefect's client uses it
        assert str(client.api_url).rstrip("/") == url, (client.api_url, url)
        client.api_healthcheck()
    print(url, flush=True)
    time.sleep(600)
"""


LAST_CALL = """
import signal, sys, time
import psutil
from flows.prefect_server import temporary_prefect_server
from prefect.client.orchestration import get_client
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(time.monotonic()))

def server_handled_its_sigterm(server):  # it said it stays for the run, or it is ending
    with open(sys.argv[1], errors="replace") as log:
        said = "still needs this server" in log.read()
    return said or not server.is_running() or server.status() == psutil.STATUS_ZOMBIE

with temporary_prefect_server(sys.argv[1]) as url:
    [server] = [p for p in psutil.Process().children() if "flows.prefect_server" in p.cmdline()]
    print(url, flush=True)
    deadline = time.monotonic() + 60
    while not (stop and server_handled_its_sigterm(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stop, "no SIGTERM came"
    with get_client(sync_client=True) as client:
        client.hello().raise_for_status()  # the run's last call, after the stop
    print("answered after the SIGTERM", flush=True)
"""


def _server_of(run_pid):
    """The temporary server process started by the run ``run_pid``."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "flows.prefect_server" in cmd and str(run_pid) in cmd:
            return proc
    return None


@contextlib.contextmanager
def _run(script, log_path):
    """``script`` run in a session of its own, as ``damptune tune`` is, on its temporary
    server: yields (the run, the server's URL, the server's process); kills what is left."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    run = subprocess.Popen([sys.executable, "-c", script, str(log_path)], env=env,
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        url = run.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, run.poll())
        server = _server_of(run.pid)
        assert server is not None
        yield run, url, server
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        leftover = _server_of(run.pid)
        if leftover is not None:
            leftover.kill()


def test_the_runs_prefect_server_has_its_own_session_and_dies_with_the_run(tmp_path):
    with _run(RUN, tmp_path / "server.log") as (run, url, server):
        assert os.getpgid(server.pid) != os.getpgid(run.pid)  # a Ctrl-C of the run's group
        with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:  # misses it
            assert answer.status == 200
        os.killpg(run.pid, signal.SIGKILL)  # the run dies without stopping it
        run.wait(30)
        deadline = time.monotonic() + 60
        while server.is_running() and server.status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, \
            "the temporary Prefect server outlived its run"


def test_a_sigterm_to_every_process_leaves_the_server_to_the_runs_last_calls(tmp_path):
    """systemd stopping a unit, a machine's shutdown, SLURM: every process gets the SIGTERM on
    its own, the server too. The run still makes its last calls (its flow run's final state,
    the summary) and they are answered; then the run stops the server. Before, the server
    stopped at its SIGTERM, and the run's call after it failed (this test: exit status 1)."""
    with _run(LAST_CALL, tmp_path / "server.log") as (run, _, server):
        server.send_signal(signal.SIGTERM)  # each process on its own, the server first
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 0 and out.startswith("answered"), (run.returncode, out)
        server.wait(30)  # the run stopped it
        assert "still needs this server" in (tmp_path / "server.log").read_text()
