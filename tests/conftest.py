"""Shared fixtures: a real Dask LocalCluster (4 single-threaded worker processes), a Prefect
server, and the clean run of the fault tests' grid."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import tempfile
import threading

import pytest
import torch

# A test (its fixtures' setup and teardown included) that outlives its pytest-timeout limit by
# this much was not ended by its alarm (a thread it waits for never stops, or the main thread
# is stuck where no signal handler runs): print every thread's stack and end the run, so CI
# fails at the place it hangs instead of at its own time limit with nothing to show.
HANG_GRACE_SECONDS = 180
# If even that cannot run (a thread holds the GIL), faulthandler's C-level timer does it.
GIL_BACKSTOP_SECONDS = 60


# the files that take minutes (`--durations` lists them): collected first, so that under
# `make test`'s two pytest-xdist workers (one file per worker at a time) they start at once
# rather than end the run alone
LONG_FILES = ("test_e2e_deployment.py", "test_resume.py", "test_churn.py")  # longest first


def pytest_configure(config):
    """Each pytest process that runs tests (each xdist worker) gets a DAMPTUNE_CACHE of its
    own, unless the caller set one: the compute calibration kept there sets every trial's
    simulated time, and two processes that measured it at once would give a clean run and the
    rerun compared with it different ones (and the suite leaves the user's ~/.cache alone).
    Not xdist's controller: its workers would inherit its directory and share it."""
    controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(
        config, "workerinput")
    if "DAMPTUNE_CACHE" not in os.environ and not controller:
        os.environ["DAMPTUNE_CACHE"] = tempfile.mkdtemp(prefix="damptune-test-cache-")
    if not controller:
        _set_torch_threads()


def _set_torch_threads() -> None:
    """Each pytest process trains with DAMPTUNE_TEST_TORCH_THREADS torch threads: 1 unless
    set, 0 for torch's default of one per core. `make test` runs two pytest processes on the
    2 cores, and with torch's default each one's local-mode training oversubscribed them, its
    OpenMP threads spinning while they waited for a core: `time DAMPTUNE_TEST_TORCH_THREADS=0
    python -m pytest -n 2 --dist loadfile tests/damptune` against the same without it (README,
    "Tests"). Dask's workers and the flow's session set their own (1); tests of thread counts
    set theirs."""
    given = os.environ.get("DAMPTUNE_TEST_TORCH_THREADS") or "1"
    if not given.isdigit():
        raise pytest.UsageError(f"DAMPTUNE_TEST_TORCH_THREADS={given!r} is not accepted: a "
                                "whole number of threads, or 0 for torch's default")
    if int(given) > 0:
        torch.set_num_threads(int(given))


def pytest_collection_modifyitems(config, items):
    def rank(item: pytest.Item) -> int:  # the long files first, longest first; stable else
        name = item.path.name
        return LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)

    items.sort(key=rank)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; this machine has none")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not a test id that says "gpu"
            item.add_marker(skip)


def _timeout_of(item: pytest.Item) -> float:
    """The pytest-timeout limit of ``item``: its ``timeout`` marker, else the ini value."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0] or 0)
    if marker is not None and "timeout" in marker.kwargs:
        return float(marker.kwargs["timeout"] or 0)
    return float(item.config.getini("timeout") or 0)


def _real_stderr_fd(config: pytest.Config) -> int:
    """The terminal's stderr while pytest captures fd 2 (its saved copy), else fd 2."""
    capture = config.pluginmanager.getplugin("capturemanager")
    err = getattr(getattr(capture, "_global_capturing", None), "err", None)
    fd = getattr(err, "targetfd_save", None)
    return fd if isinstance(fd, int) else 2


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The watchdog over one test's whole protocol: setup (session fixtures built for it
    too), call and teardown."""
    limit = _timeout_of(item)
    if limit <= 0:
        yield
        return
    capture = item.config.pluginmanager.getplugin("capturemanager")

    def dump_and_exit():
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        sys.stderr.write(f"\n{item.nodeid} still running {HANG_GRACE_SECONDS} s after its "
                         f"timeout ({limit:g} s): every thread's stack, then exit\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(limit + HANG_GRACE_SECONDS, dump_and_exit)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(limit + HANG_GRACE_SECONDS + GIL_BACKSTOP_SECONDS,
                                      exit=True, file=_real_stderr_fd(item.config))
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        timer.cancel()


@pytest.fixture(autouse=True)
def _no_stop_request_left_over():
    """Each test starts with no stop request pending. A request is process-wide
    (:mod:`damptune.interrupt`): one that a failed test left (its fault thread fired after
    its grid had ended, past the test's ``interrupt.clear()``) would end every later training
    of this pytest process interrupted, and one failure would read as many."""
    from damptune import interrupt

    interrupt.clear()


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory):
    """A real LocalCluster of 4 worker processes bound to 127.0.0.1, shared by the session."""
    from damptune.cluster import local_cluster

    cluster = local_cluster(n_workers=4, local_directory=str(tmp_path_factory.mktemp("dask")))
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def scheduler(dask_cluster) -> str:
    return dask_cluster.scheduler_address


@pytest.fixture(scope="session")
def blobs():
    """A small seeded 3-class problem: (X_train, y_train, X_test, y_test)."""
    from tests.problems import blobs

    return blobs()


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect server for the session's flow tests (started once, ~10 s); its API
    URL, for the subprocesses a test starts (without it, each would boot a server of its own)."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.settings import PREFECT_API_URL

    with _started_prefect_harness():
        yield PREFECT_API_URL.value()


HARNESS_ATTEMPTS = 3


@contextlib.contextmanager
def _started_prefect_harness():
    """Prefect's test harness, started again (at most HARNESS_ATTEMPTS times) when its start
    fails. It picks a free ephemeral port, closes it, and boots the server seconds later; in
    between, a Dask process of this or the other pytest process may take that port, and the
    harness's health check then reads from Dask (`RemoteProtocolError: Server disconnected`),
    which Prefect does not retry. Seen in CI: 38 flow tests errored at set-up."""
    import httpx
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing import utilities
    from prefect.testing.utilities import prefect_test_harness

    from infra.stack import free_port

    if hasattr(utilities, "_find_available_port"):  # its port, from outside the ephemeral
        utilities._find_available_port = free_port  # range (infra.stack.free_port); Prefect
        # 3.x's private helper: where it is gone, the retries below remain
    for attempt in range(1, HARNESS_ATTEMPTS + 1):
        before = SubprocessASGIServer._instances.get(None)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(prefect_test_harness(server_startup_timeout=120))
            except (httpx.HTTPError, RuntimeError) as exc:
                failed = SubprocessASGIServer._instances.get(None)  # the harness's, if made
                if failed is not None and failed is not before:
                    failed.stop()
                if attempt == HARNESS_ATTEMPTS:
                    raise
                print(f"Prefect test harness start {attempt} failed ({exc!r}); again",
                      file=sys.stderr)
                continue
            yield
            return


@pytest.fixture(scope="session")
def external_scheduler(tmp_path_factory):
    """A Dask scheduler and 2 workers started as separate processes; stopped by PID."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    from distributed import Client

    tmp = tmp_path_factory.mktemp("external-dask")
    log = open(tmp / "scheduler.log", "w+")  # noqa: SIM115 - closed below
    procs = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--no-dashboard"], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)]
    address = None
    deadline = time.monotonic() + 60
    while address is None and time.monotonic() < deadline:
        time.sleep(0.5)
        log.seek(0)
        match = re.search(r"Scheduler at:\s+(tcp://127\.0\.0\.1:\d+)", log.read())
        address = match.group(1) if match else None
    assert address, "the scheduler did not start"
    for i in range(2):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(tmp / f"w{i}")],
            stdout=open(tmp / f"worker{i}.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True))
    with Client(address, timeout="30s") as client:
        client.wait_for_workers(2, timeout=60)
    yield address
    for proc in reversed(procs):
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    log.close()


@pytest.fixture(scope="session")
def clean(tmp_path_factory, scheduler, prefect_harness):
    """The fault tests' grid (tests/flows/grids.GRID, grid name "g"), never interrupted: the
    reference every recovery of tests/flows and of the deployment tests must equal."""
    from flows.tune import tune
    from tests.flows.grids import GRID, trials_of

    run_dir = str(tmp_path_factory.mktemp("clean"))
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    return trials_of(run_dir, "g")
