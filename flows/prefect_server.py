"""The temporary Prefect server of a ``damptune tune`` run that names no ``PREFECT_API_URL``.

Prefect's own temporary server (its ephemeral mode) runs in the run's process group. A signal
to that group (Ctrl-C in a terminal, ``timeout``, ``kill -- -PGID``) stopped the server with
the run: the run's trials checkpointed, but its last API calls (the summary's artifact, the
flow run's final state) then waited through the client's retries, about a minute each. This
one runs in a session of its own, bound to 127.0.0.1, exits when the run's process is gone
(``main`` watches its parent), and the run stops it by PID when it ends (SIGINT).

Where every process gets the SIGTERM on its own (systemd stopping a unit, a machine's
shutdown, SLURM's signal to the job's steps), the server would stop before the run's last
calls: it takes a SIGTERM only once the run is gone, and says so in its log meanwhile.

``python -m flows.prefect_server PARENT_PID PORT`` is the server's own process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

__all__ = ["temporary_prefect_server"]

log = logging.getLogger("damptune.flows")
START_TIMEOUT_S = 120.0  # a first start migrates Prefect's database: slow on a loaded machine
STOP_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 10.0


@contextlib.contextmanager
def temporary_prefect_server(log_path: str) -> Iterator[str | None]:
    """Within the block, Prefect's client uses a temporary server of this process (its API
    URL is yielded; its output goes to ``log_path``); None, and nothing started, when a
    ``PREFECT_API_URL`` is set."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield None
        return
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.prefect_server",
                                 str(os.getpid()), str(port)], env=_server_env(),
                                start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(proc, url, log_path)
        log.info("a temporary Prefect server on %s (pid %d), stopped when the run ends",
                 url, proc.pid)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            try:
                yield url
            finally:
                _drain_prefect_services()
    finally:
        _stop(proc)


def _drain_prefect_services() -> None:
    """The logs and events Prefect's workers still hold go to the server before it stops (as
    Prefect's own test harness does); else they would try at the interpreter's exit, against
    a server gone, through the client's retries."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):  # a service never started has nothing to send
            service.drain_all(timeout=DRAIN_TIMEOUT_S)


def _server_env() -> dict[str, str]:
    """Prefect's own temporary server's settings: no UI, marked ephemeral."""
    from prefect.settings import get_current_settings

    return {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True)}


def _free_port() -> int:
    """A free port of 127.0.0.1 in 8000–8999, as Prefect picks its temporary server's (out of
    the range where other processes' port 0 lands)."""
    ports = random.sample(range(8000, 9000), 1000)
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8000-8999 on 127.0.0.1 for a temporary Prefect server")


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"the temporary Prefect server exited with status "
                               f"{proc.returncode} before it answered ({log_path}): {tail}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health",
                                                                 timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.2)
    _stop(proc)
    raise RuntimeError(f"the temporary Prefect server did not answer at {url} within "
                       f"{START_TIMEOUT_S:g} s (its output: {log_path})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the server's session (uvicorn shuts down; a SIGTERM waits for the run to be
    gone: :class:`_RunServer`), SIGKILL after the timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _watch_parent(parent: int) -> None:
    """SIGTERM to this process once ``parent`` is gone (its run was SIGKILLed)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> None:
    import uvicorn

    class _RunServer(uvicorn.Server):
        """Shuts down on SIGINT (the run's stop), and on SIGTERM only once the run is gone:
        the run, signalled with it, still makes its last calls."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and os.getppid() == parent:
                print(f"SIGTERM: the run (pid {parent}) still needs this server; it stops "
                      "when the run stops it or is gone", file=sys.stderr, flush=True)
                return
            super().handle_exit(sig, frame)

    parent, port = int(argv[0]), int(argv[1])
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True,
                            host="127.0.0.1", port=port, log_level="error", lifespan="on")
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises the SIGINT again at its end
        _RunServer(config).run()


if __name__ == "__main__":
    main(sys.argv[1:])
