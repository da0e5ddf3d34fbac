"""The local stack: a Prefect server, a process work pool and worker, and an MLflow server.

Everything binds to 127.0.0.1 and lives under one *run directory* (default ``runs/stack``)::

    RUN/
      prefect/            PREFECT_HOME of the server and the worker (its results storage)
      prefect.db          the Prefect server's SQLite database
      mlflow.db           the MLflow tracking store (SQLite)
      mlartifacts/        MLflow artifacts, served by the MLflow server (``mlflow-artifacts:/``)
      pids/<name>.pid     the PID of each service (the leader of its own session)
      logs/<name>.log     each service's stdout and stderr
      stack.json          ports and process identities (PID + start time) of what is running
      stack.env           ``export`` lines for a shell: ``source runs/stack/stack.env``

Services, in start order: ``mlflow`` and ``prefect-server`` (started together, each waited for
on its health endpoint), the work pool ``damptune`` (type ``process``, created once), then
``prefect-worker`` (healthy when the server lists it ONLINE in the pool). The worker carries
``PREFECT_API_URL`` and ``MLFLOW_TRACKING_URI``, so the flow runs it launches report to this
server and log to this MLflow. ``down`` stops the worker first, then the Prefect server, then
MLflow: SIGTERM to the process group and every descendant, SIGKILL after a timeout. Flow runs
in flight when the worker stops are marked Crashed, so that they do not hold their deployment's
concurrency slot; ``up`` does the same for runs whose process died with an earlier worker.
Flow runs send heartbeats (every 30 s), and ``up`` creates, once, the automation that marks
Crashed a run whose heartbeats stop (its machine died, and ``up`` never ran there again), from
``infra/automation-zombie.yaml`` (the file ``prefect automation create --from-file`` takes).

Command line (from the repository root)::

    python -m infra.stack up [--run-dir runs/stack] [--prefect-port 4200] [--mlflow-port 5000]
    python -m infra.stack status | env | down [--run-dir runs/stack]

From Python (what the tests use)::

    with running_stack("runs/tmp", prefect_port=4201, mlflow_port=5001) as stack:
        subprocess.run(["prefect", "deploy", "--all"], env={**os.environ, **stack.env})

``up`` reuses the services of the run directory that are alive and healthy, and starts the
others (a running server is replaced only after three failed health checks in a row, so one
slow answer from a busy server does not cost its clients their server); :func:`running_stack`
stops, on exit, exactly what it started.

Structure: the services are a table, ``SPECS`` (one :class:`ServiceSpec` each: command,
environment, health check, the address ``status`` shows, ``before_start`` and ``after_stop``
hooks (the MLflow server's store, made and put in WAL mode before it starts); PID file and log
from :class:`StackPaths`). ``up`` starts them with one loop, group by group
(``START_GROUPS``; the work pool, the zombie automation and the orphaned runs in between);
``down`` and ``status`` walk the same table in ``SERVICES`` order. Everything asked of the
Prefect server goes through Prefect's Python client (:mod:`infra.prefect_api`); only the
health endpoints are plain HTTP GETs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from infra.prefect_api import (
    HEARTBEAT_S,
    ZOMBIE_AUTOMATION,
    crash_orphaned_runs,
    ensure_pool,
    ensure_zombie_automation,
    worker_online,
)

__all__ = [
    "DEFAULT_MLFLOW_PORT",
    "DEFAULT_PREFECT_PORT",
    "DEFAULT_RUN_DIR",
    "HOST",
    "POOL",
    "REPO_ROOT",
    "SERVICES",
    "SPECS",
    "ServiceSpec",
    "ServiceStatus",
    "Stack",
    "StackError",
    "StackPaths",
    "ZOMBIE_AUTOMATION",
    "base_env",
    "down",
    "free_port",
    "read_state",
    "running_stack",
    "status",
    "up",
]

HOST = "127.0.0.1"
DEFAULT_RUN_DIR = Path("runs/stack")
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
POOL = "damptune"
WORKER_NAME = "damptune-local"
# stop order: the worker before the server it talks to, MLflow last
SERVICES = ("prefect-worker", "prefect-server", "mlflow")
REPO_ROOT = Path(__file__).resolve().parents[1]


class StackError(RuntimeError):
    """A service of the local stack could not be started, reached or stopped."""


# ---------------------------------------------------------------------------------------------
# paths, URLs and environments


@dataclass(frozen=True)
class Stack:
    """A running local stack: where it lives, its addresses, and what this call started."""

    run_dir: Path
    prefect_port: int
    mlflow_port: int
    started: tuple[str, ...] = ()
    reused: tuple[str, ...] = ()

    @property
    def prefect_ui_url(self) -> str:
        return f"http://{HOST}:{self.prefect_port}"

    @property
    def prefect_api_url(self) -> str:
        return f"{self.prefect_ui_url}/api"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{HOST}:{self.mlflow_port}"

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to use this stack (also written to ``stack.env``)."""
        return {
            "PREFECT_API_URL": self.prefect_api_url,
            "MLFLOW_TRACKING_URI": self.mlflow_uri,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }


@dataclass(frozen=True)
class ServiceStatus:
    """One service as ``status`` sees it."""

    name: str
    pid: int | None
    alive: bool
    healthy: bool
    url: str
    detail: str = ""


@dataclass
class StackPaths:
    run_dir: Path
    pids: Path = field(init=False)
    logs: Path = field(init=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).resolve()
        self.pids = self.run_dir / "pids"
        self.logs = self.run_dir / "logs"

    @property
    def state(self) -> Path:
        return self.run_dir / "stack.json"

    @property
    def env_file(self) -> Path:
        return self.run_dir / "stack.env"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"


def read_state(run_dir: str | Path) -> dict:
    """What ``stack.json`` of ``run_dir`` records (ports, services), or {} if nothing."""
    paths = StackPaths(Path(run_dir))
    try:
        return json.loads(paths.state.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_state(paths: StackPaths, state: dict) -> None:
    tmp = paths.state.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, paths.state)


def _write_env_file(paths: StackPaths, stack: Stack) -> None:
    lines = [f"export {key}={value}" for key, value in stack.env.items()]
    paths.env_file.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# processes


def base_env() -> dict[str, str]:
    """This environment less the client settings that would point a service elsewhere."""
    env = dict(os.environ)
    # a client setting inherited from the caller's shell must not point a service elsewhere
    for key in ("PREFECT_API_URL", "PREFECT_API_KEY", "MLFLOW_TRACKING_URI", "PREFECT_PROFILE"):
        env.pop(key, None)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _default_sigint() -> None:
    """Run in the child between fork and exec: SIGINT back to its default action.

    A shell without job control (a script, ``nohup make run &``) starts a command of ``&`` with
    SIGINT ignored, and the services would inherit that: Python then installs no SIGINT handler
    and leaves it ignored. Prefect's worker answers SIGTERM by sending itself SIGINT (which
    stops it), so ignored, the worker went on polling and ``down`` had to SIGKILL it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(paths: StackPaths, name: str, cmd: list[str], *, env: Mapping[str, str],
           cwd: Path) -> psutil.Process:
    """Start ``cmd`` as the leader of a new session; record its PID; log to ``logs/name.log``."""
    paths.pids.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    log = paths.log_file(name).open("ab")
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
    log.flush()
    try:
        proc = subprocess.Popen(
            cmd, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_sigint,
        )
    finally:
        log.close()
    paths.pid_file(name).write_text(f"{proc.pid}\n")
    try:
        return psutil.Process(proc.pid)
    except psutil.NoSuchProcess as exc:  # exited at once: the log says why
        raise StackError(f"{name} exited at once; see {paths.log_file(name)}:\n"
                         f"{_log_tail(paths, name)}") from exc


def _recorded_process(paths: StackPaths, name: str, state: dict) -> psutil.Process | None:
    """The live process recorded for ``name``, if it is still the one this stack started."""
    try:
        pid = int(paths.pid_file(name).read_text().strip())
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        recorded = state.get("services", {}).get(name, {})
        if recorded.get("pid") == pid and "create_time" in recorded:
            same = abs(proc.create_time() - recorded["create_time"]) < 0.05
        else:  # no identity recorded: accept our own kind of process only
            same = name.split("-")[0] in " ".join(proc.cmdline())
        return proc if same else None
    except (FileNotFoundError, ValueError, psutil.Error):
        return None


def _stop_process(proc: psutil.Process, *, timeout_s: float) -> list[int]:
    """SIGTERM the process's group and all its descendants; SIGKILL what is left after a wait
    of ``timeout_s``. The PIDs that had to be killed."""
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    # one SIGTERM each: Prefect's CLI turns a second SIGTERM into an immediate SIGKILL
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)  # the leader of its own session: pgid == pid
    for p in family[1:]:  # descendants that left the group (flow runs in their own session)
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(p.pid) != proc.pid:
                p.terminate()
    _, alive = psutil.wait_procs(family, timeout=timeout_s)
    killed = [p.pid for p in alive]
    if alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        _, alive = psutil.wait_procs(alive, timeout=5)
    if alive:
        raise StackError(f"processes {[p.pid for p in alive]} survived SIGKILL")
    return killed


def _log_tail(paths: StackPaths, name: str, n_lines: int = 25) -> str:
    try:
        lines = paths.log_file(name).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join("    " + line for line in lines[-n_lines:])


# ---------------------------------------------------------------------------------------------
# health


def _http_ok(url: str, expected: bytes, *, timeout_s: float = 3.0) -> bool:
    """Whether GET ``url`` answers 200 with body ``expected`` (a health endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200 and response.read().strip() == expected)
    except (urllib.error.URLError, OSError):
        return False


HEALTH_PROBES = 3  # failed health checks in a row before a running server is replaced
HEALTH_PROBE_PAUSE_S = 1.0


def _keeps_failing(check: Callable[[], bool]) -> bool:
    """Whether ``check`` fails :data:`HEALTH_PROBES` times in a row, a pause apart."""
    for probe in range(HEALTH_PROBES):
        if check():
            return False
        if probe + 1 < HEALTH_PROBES:
            time.sleep(HEALTH_PROBE_PAUSE_S)
    return True


def _api(port: int) -> str:
    return f"http://{HOST}:{port}/api"


def _prefect_healthy(port: int) -> bool:
    return _http_ok(f"http://{HOST}:{port}/api/health", b"true")


def _mlflow_healthy(port: int) -> bool:
    return _http_ok(f"http://{HOST}:{port}/health", b"OK")


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
        try:
            sock.bind((HOST, port))
        except OSError:
            return True
    return False


def _wait_healthy(paths: StackPaths, name: str, proc: psutil.Process, check, *, url: str,
                  timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            raise StackError(f"{name} exited before {url} answered healthy; "
                             f"its log {paths.log_file(name)} ends with:\n"
                             f"{_log_tail(paths, name)}")
        time.sleep(0.5)
    raise StackError(f"{name} (pid {proc.pid}) did not answer healthy at {url} within "
                     f"{timeout_s:.0f} s; its log {paths.log_file(name)} ends with:\n"
                     f"{_log_tail(paths, name)}")


# ---------------------------------------------------------------------------------------------
# up / down / status


# free_port's ports start here: above the registered ports of common services
FREE_PORT_FLOOR = 20000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for tests and a second stack),
    below the kernel's ephemeral range: a port the OS picks on its own (a Dask worker's
    `--port 0`, an outgoing connection's) cannot take it between now and the moment the
    server asked for binds it, seconds later. Random, so that two callers rarely agree."""
    candidates = range(FREE_PORT_FLOOR, _ephemeral_ports()[0])
    for port in random.sample(candidates, min(100, len(candidates))):
        if not _port_in_use(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # all taken: the OS's
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for ports it assigns itself (Linux's default where unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _check_port_free(port: int, name: str, option: str) -> None:
    if _port_in_use(port):
        raise StackError(
            f"port {port} on {HOST} is already in use by another process, so the {name} cannot "
            f"listen there. Stop that process (`ss -ltnp 'sport = :{port}'` shows it) or choose "
            f"another port with {option}."
        )


@dataclass(frozen=True)
class ServiceSpec:
    """One row of the stack's table: a service, how to start it, how to know it is healthy.

    ``command(stack, paths, worker_limit)`` and ``env(stack, paths)`` give its process;
    ``healthy(stack, process)`` and ``health_url(stack)`` its check; ``address(stack)`` is what
    ``status`` shows; ``port_attr`` names the :class:`Stack` port it binds (checked free before
    anything starts; its command-line option is ``--<port-attr>``); it runs in the repository
    (``in_repo``) or the run directory; ``before_start(paths)``, if any, runs just before its
    process is started, ``after_stop(state, report)`` once it is stopped. Its PID file and log
    are ``RUN/pids/<name>.pid`` and ``RUN/logs/<name>.log`` (:class:`StackPaths`).
    """

    name: str
    label: str
    command: Callable[[Stack, StackPaths, int], list[str]]
    env: Callable[[Stack, StackPaths], dict[str, str]]
    healthy: Callable[[Stack, psutil.Process], bool]
    health_url: Callable[[Stack], str]
    address: Callable[[Stack], str]
    port_attr: str = ""
    in_repo: bool = False
    before_start: Callable[[StackPaths], None] | None = None
    after_stop: Callable[[dict, Callable[[str], None]], None] | None = None


def _mlflow_store_url(paths: StackPaths) -> str:
    return f"sqlite:///{paths.run_dir / 'mlflow.db'}"


def _mlflow_command(stack: Stack, paths: StackPaths, _: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "server", "--host", HOST,
            "--port", str(stack.mlflow_port), "--workers", "1",
            "--backend-store-uri", _mlflow_store_url(paths),
            "--artifacts-destination", str(paths.run_dir / "mlartifacts")]


def _mlflow_store(paths: StackPaths) -> None:
    """The server's SQLite store: a new one is a copy of the empty store (not MLflow's ~3 s
    of migrations), and it is in WAL mode (:mod:`tasks.mlflow_store`, :mod:`tasks.sqlite`)."""
    from tasks.mlflow_store import open_sqlite_store

    open_sqlite_store(_mlflow_store_url(paths))


def _mlflow_env(stack: Stack, paths: StackPaths) -> dict[str, str]:
    return {**base_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _server_command(stack: Stack, paths: StackPaths, _: int) -> list[str]:
    return [sys.executable, "-m", "prefect", "--no-prompt", "server", "start", "--host", HOST,
            "--port", str(stack.prefect_port)]


SLOT_WAIT_S = 5


def _server_env(stack: Stack, paths: StackPaths) -> dict[str, str]:
    return {**base_env(), "PREFECT_HOME": str(paths.run_dir / "prefect"),
            "PREFECT_API_DATABASE_CONNECTION_URL":
                f"sqlite+aiosqlite:///{paths.run_dir / 'prefect.db'}",
            "PREFECT_API_URL": stack.prefect_api_url,
            # a run queued behind a deployment's concurrency limit (AwaitingConcurrencySlot)
            # asks for its slot again after this many seconds (Prefect's default: 30): it
            # starts within ~5 s of the slot freeing
            "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": str(SLOT_WAIT_S)}


def _worker_command(stack: Stack, paths: StackPaths, limit: int) -> list[str]:
    return [sys.executable, "-m", "prefect", "--no-prompt", "worker", "start", "--pool", POOL,
            "--type", "process", "--name", WORKER_NAME, "--limit", str(limit),
            "--install-policy", "never"]


def _worker_env(stack: Stack, paths: StackPaths) -> dict[str, str]:
    return {**base_env(), **stack.env, "PREFECT_HOME": str(paths.run_dir / "prefect"),
            "PREFECT_WORKER_QUERY_SECONDS": "2",  # pick a new run up within ~2 s
            # flow runs send heartbeats: the zombie automation crashes them when they stop
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}


def _worker_healthy(stack: Stack, proc: psutil.Process) -> bool:
    return worker_online(stack.prefect_api_url, POOL, WORKER_NAME, since=proc.create_time())


def _crash_runs_of_stopped_worker(state: dict, report: Callable[[str], None]) -> None:
    """Flow runs in flight die with the worker: mark them Crashed (they would hold a slot)."""
    if "prefect_port" in state:
        crashed = crash_orphaned_runs(_api(state["prefect_port"]), POOL)
        if crashed:
            report(f"flow runs stopped with the worker, marked Crashed: {', '.join(crashed)}")


SPECS = {spec.name: spec for spec in (
    ServiceSpec("mlflow", "MLflow server", _mlflow_command, _mlflow_env,
                lambda stack, _: _mlflow_healthy(stack.mlflow_port),
                lambda stack: f"{stack.mlflow_uri}/health", lambda stack: stack.mlflow_uri,
                port_attr="mlflow_port", before_start=_mlflow_store),
    ServiceSpec("prefect-server", "Prefect server", _server_command, _server_env,
                lambda stack, _: _prefect_healthy(stack.prefect_port),
                lambda stack: f"{stack.prefect_api_url}/health",
                lambda stack: stack.prefect_ui_url, port_attr="prefect_port"),
    ServiceSpec("prefect-worker", "Prefect worker", _worker_command, _worker_env,
                _worker_healthy,
                lambda stack: f"{stack.prefect_api_url}/work_pools/{POOL}/workers",
                lambda stack: f"pool {POOL!r} on {stack.prefect_ui_url}", in_repo=True,
                after_stop=_crash_runs_of_stopped_worker),
)}
# start order: the servers together (2 cores, two imports), then the pool, then the worker
START_GROUPS = (("mlflow", "prefect-server"), ("prefect-worker",))


class _Starter:
    """Starts the stack's missing services group by group and records each in ``stack.json``."""

    def __init__(self, paths: StackPaths, stack: Stack, state: dict,
                 running: dict[str, psutil.Process], *, worker_limit: int, timeout_s: float,
                 report: Callable[[str], None]) -> None:
        self.paths, self.stack, self.state, self.running = paths, stack, state, running
        self.worker_limit, self.timeout_s, self.report = worker_limit, timeout_s, report
        self.started: list[str] = []

    def replace_unhealthy(self) -> None:
        """An unhealthy server of ours would stop a new one from binding: stop it. Unhealthy
        means it failed :data:`HEALTH_PROBES` checks in a row: a server that is only slow for
        a moment (busy with a grid on a loaded machine) is kept, with its clients."""
        for name in START_GROUPS[0]:
            if name in self.running and _keeps_failing(
                    lambda n=name: SPECS[n].healthy(self.stack, self.running[n])):
                _stop_process(self.running.pop(name), timeout_s=20)
                self.state["services"].pop(name, None)
                self.paths.pid_file(name).unlink(missing_ok=True)

    def check_ports(self) -> None:
        """Every port first, so that a taken one fails before anything starts."""
        for spec in SPECS.values():
            if spec.port_attr and spec.name not in self.running:
                _check_port_free(getattr(self.stack, spec.port_attr), spec.label,
                                 "--" + spec.port_attr.replace("_", "-"))

    def start_group(self, names: tuple[str, ...]) -> None:
        """Start the group's services that are not running, then wait for each."""
        new = [SPECS[n] for n in names if n not in self.running]
        for spec in new:
            if spec.before_start is not None:
                spec.before_start(self.paths)
            cmd = spec.command(self.stack, self.paths, self.worker_limit)
            proc = _spawn(self.paths, spec.name, cmd, env=spec.env(self.stack, self.paths),
                          cwd=REPO_ROOT if spec.in_repo else self.paths.run_dir)
            self.started.append(spec.name)
            self.running[spec.name] = proc
            self.state["services"][spec.name] = {"pid": proc.pid,
                                                 "create_time": proc.create_time(), "cmd": cmd}
            _write_state(self.paths, self.state)
        for spec in new:
            proc, url = self.running[spec.name], spec.health_url(self.stack)
            _wait_healthy(self.paths, spec.name, proc,
                          lambda s=spec, p=proc: s.healthy(self.stack, p), url=url,
                          timeout_s=self.timeout_s)
            self.report(f"{spec.name} healthy at {url} (pid {proc.pid})")

    def prepare_worker(self) -> None:
        """The work pool, the zombie automation, and runs a dead worker left in flight."""
        api = self.stack.prefect_api_url
        ensure_pool(api, POOL)
        self.report(f"work pool {POOL!r} (type process) ready")
        if ensure_zombie_automation(api):
            self.report(f"automation {ZOMBIE_AUTOMATION!r} created")
        if "prefect-worker" not in self.running:
            crashed = crash_orphaned_runs(api, POOL)  # left by a worker that died
            if crashed:
                self.report(f"flow runs whose process is gone, marked Crashed: "
                            f"{', '.join(crashed)}")


def up(run_dir: str | Path = DEFAULT_RUN_DIR, *, prefect_port: int = DEFAULT_PREFECT_PORT,
       mlflow_port: int = DEFAULT_MLFLOW_PORT, worker_limit: int = 1,
       timeout_s: float = 180.0, progress: Callable[[str], None] | None = None) -> Stack:
    """Start the services of ``run_dir`` that are not already running and healthy.

    Args:
        run_dir: where the databases, artifacts, PIDs, logs and ``stack.env`` go.
        prefect_port: port of the Prefect server (API and UI) on 127.0.0.1.
        mlflow_port: port of the MLflow server (API and UI) on 127.0.0.1.
        worker_limit: flow runs the worker runs at once (a tuning flow uses all the cores).
        timeout_s: how long to wait for each service to answer healthy.
        progress: called with a line as each service becomes healthy (e.g. ``print``).

    Returns:
        The stack, with ``started`` (the services this call started) and ``reused``.

    Raises:
        StackError: a port is taken by another process, the run directory's stack runs on
            other ports, or a service did not answer healthy (the message quotes its log).

    Example:
        >>> stack = up("runs/stack", prefect_port=4200, mlflow_port=5000)  # doctest: +SKIP
        >>> stack.prefect_api_url  # doctest: +SKIP
        'http://127.0.0.1:4200/api'
    """
    paths = StackPaths(Path(run_dir))
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    state, running = _reconcile(paths, prefect_port=prefect_port, mlflow_port=mlflow_port)
    stack = Stack(paths.run_dir, prefect_port, mlflow_port)
    t0 = time.monotonic()

    def report(line: str) -> None:
        if progress is not None:
            progress(f"[{time.monotonic() - t0:5.1f} s] {line}")

    starter = _Starter(paths, stack, state, running, worker_limit=worker_limit,
                       timeout_s=timeout_s, report=report)
    try:
        starter.replace_unhealthy()
        starter.check_ports()
        starter.start_group(START_GROUPS[0])
        starter.prepare_worker()
        starter.start_group(START_GROUPS[1])
    except BaseException:
        _stop(paths, [n for n in SERVICES if n in starter.started], timeout_s=20)
        raise
    stack = Stack(paths.run_dir, prefect_port, mlflow_port, started=tuple(starter.started),
                  reused=tuple(n for n in SERVICES if n in running and n not in starter.started))
    _write_env_file(paths, stack)
    return stack


def _reconcile(paths: StackPaths, *, prefect_port: int,
               mlflow_port: int) -> tuple[dict, dict[str, psutil.Process]]:
    """The run directory's recorded services that still run (on these ports, or an error);
    stale PID files removed; the state rewritten with the ports."""
    state = read_state(paths.run_dir)
    running = {name: p for name in SERVICES if (p := _recorded_process(paths, name, state))}
    if running:
        ports = {"prefect_port": prefect_port, "mlflow_port": mlflow_port}
        other = {k: state.get(k) for k, v in ports.items() if state.get(k) not in (None, v)}
        if other:
            raise StackError(
                f"the stack of {paths.run_dir} is running with {other}, not {ports}; "
                f"stop it first (python -m infra.stack down --run-dir {paths.run_dir}) or use "
                f"those ports"
            )
    for name in SERVICES:  # a stale PID file of a dead or foreign process
        if name not in running:
            paths.pid_file(name).unlink(missing_ok=True)
    services = {name: rec for name, rec in state.get("services", {}).items() if name in running}
    state = {"prefect_port": prefect_port, "mlflow_port": mlflow_port, "services": services}
    _write_state(paths, state)
    return state, running


def _stop(paths: StackPaths, names: list[str], *, timeout_s: float,
          progress: Callable[[str], None] | None = None) -> list[str]:
    """Stop ``names`` in stop order (``SERVICES``); each spec's ``after_stop`` follows it."""
    state = read_state(paths.run_dir)
    stopped = []
    for name in SERVICES:  # worker, then Prefect server, then MLflow
        if name not in names:
            continue
        proc = _recorded_process(paths, name, state)
        if proc is not None:
            killed = _stop_process(proc, timeout_s=timeout_s)
            if killed and progress is not None:
                progress(f"{name}: processes {killed} did not stop within {timeout_s:g} s of "
                         "SIGTERM; SIGKILLed")
            stopped.append(name)
            after_stop = SPECS[name].after_stop
            if after_stop is not None:
                after_stop(state, progress or (lambda _: None))
        paths.pid_file(name).unlink(missing_ok=True)
        state.get("services", {}).pop(name, None)
        if paths.state.exists():
            _write_state(paths, state)
    return stopped


def down(run_dir: str | Path = DEFAULT_RUN_DIR, *, services: tuple[str, ...] = SERVICES,
         timeout_s: float = 20.0, progress: Callable[[str], None] | None = None) -> list[str]:
    """Stop the stack's services (worker, Prefect server, MLflow, in that order) by PID.

    Flow runs in flight are stopped with the worker (their processes are its descendants) and
    marked Crashed, so that they do not hold their deployment's concurrency slot.

    Returns:
        The names of the services that were running and are now stopped.
    """
    unknown = set(services) - set(SERVICES)
    if unknown:
        raise StackError(f"unknown services {sorted(unknown)}; the stack has {list(SERVICES)}")
    paths = StackPaths(Path(run_dir))
    stopped = _stop(paths, list(services), timeout_s=timeout_s, progress=progress)
    if not any(paths.pid_file(n).exists() for n in SERVICES):
        paths.env_file.unlink(missing_ok=True)
    return stopped


def status(run_dir: str | Path = DEFAULT_RUN_DIR) -> list[ServiceStatus]:
    """Each service: its recorded PID, whether that process is alive, and its health check."""
    paths = StackPaths(Path(run_dir))
    state = read_state(paths.run_dir)
    stack = Stack(paths.run_dir, state.get("prefect_port", DEFAULT_PREFECT_PORT),
                  state.get("mlflow_port", DEFAULT_MLFLOW_PORT))
    result = []
    for name in SERVICES:
        spec = SPECS[name]
        proc = _recorded_process(paths, name, state)
        try:
            recorded = int(paths.pid_file(name).read_text().strip())
        except (FileNotFoundError, ValueError):
            recorded = None
        detail = "" if recorded is None or proc is not None else "stale PID file"
        result.append(ServiceStatus(name, recorded, proc is not None,
                                    proc is not None and spec.healthy(stack, proc),
                                    spec.address(stack), detail))
    return result


@contextlib.contextmanager
def running_stack(run_dir: str | Path, *, prefect_port: int, mlflow_port: int,
                  worker_limit: int = 1, timeout_s: float = 180.0) -> Iterator[Stack]:
    """The stack of ``run_dir``, up for the ``with`` block; stops on exit what it started.

    Example:
        >>> with running_stack("runs/t", prefect_port=4201, mlflow_port=5001) as stack:
        ...     print(stack.env["PREFECT_API_URL"])  # doctest: +SKIP
        http://127.0.0.1:4201/api
    """
    stack = up(run_dir, prefect_port=prefect_port, mlflow_port=mlflow_port,
               worker_limit=worker_limit, timeout_s=timeout_s)
    try:
        yield stack
    finally:
        down(run_dir, services=stack.started)


# ---------------------------------------------------------------------------------------------
# command line


def _print_addresses(stack: Stack) -> None:
    print(f"Prefect UI:  {stack.prefect_ui_url}")
    print(f"Prefect API: {stack.prefect_api_url}")
    print(f"MLflow UI:   {stack.mlflow_uri}")
    print(f"shell:       source {stack.run_dir / 'stack.env'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.stack", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                        help="where databases, artifacts, PIDs and logs go (%(default)s)")
    parser.add_argument("--prefect-port", type=int, default=None,
                        help=f"Prefect server port (default {DEFAULT_PREFECT_PORT}, or the "
                        "running stack's)")
    parser.add_argument("--mlflow-port", type=int, default=None,
                        help=f"MLflow server port (default {DEFAULT_MLFLOW_PORT}, or the "
                        "running stack's)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="up: seconds to wait for each service to be healthy (%(default)s)")
    parser.add_argument("--stop-timeout", type=float, default=20.0,
                        help="down: seconds from each service's SIGTERM to SIGKILL of what "
                        "is left of it and its flow runs (%(default)s)")
    args = parser.parse_args(argv)
    state = read_state(args.run_dir)
    pport = args.prefect_port or state.get("prefect_port", DEFAULT_PREFECT_PORT)
    mport = args.mlflow_port or state.get("mlflow_port", DEFAULT_MLFLOW_PORT)
    try:
        if args.command == "up":
            t0 = time.monotonic()
            stack = up(args.run_dir, prefect_port=pport, mlflow_port=mport,
                       timeout_s=args.timeout, progress=print)
            if stack.started:
                print(f"started {', '.join(stack.started)} in {time.monotonic() - t0:.1f} s")
            if stack.reused:
                print(f"already running: {', '.join(stack.reused)}")
            _print_addresses(stack)
        elif args.command == "down":
            t0 = time.monotonic()
            stopped = down(args.run_dir, timeout_s=args.stop_timeout, progress=print)
            what = ", ".join(stopped) if stopped else "nothing was running"
            print(f"stopped: {what} ({time.monotonic() - t0:.1f} s)")
        elif args.command == "status":
            rows = status(args.run_dir)
            for row in rows:
                pid = "-" if row.pid is None else str(row.pid)
                alive = "alive" if row.alive else "not running"
                health = ("healthy" if row.healthy else "unhealthy") if row.alive else "-"
                print(f"{row.name:15s} pid {pid:>8s}  {alive:11s}  {health:9s}  {row.url}"
                      + (f"  ({row.detail})" if row.detail else ""))
            return 0 if all(row.healthy for row in rows) else 1
        else:  # env
            for key, value in Stack(StackPaths(args.run_dir).run_dir, pport, mport).env.items():
                print(f"export {key}={value}")
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
