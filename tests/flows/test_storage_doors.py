"""Faults of storage at a grid's door: a corrupt Optuna or MLflow store, a read-only run
directory, a full disk and an MLflow that does not answer are refused before any work with an
error that names the file and the cause (a fault of the storage, never bad input: `damptune
tune` exits 1, not 2), and every file of the earlier grid is left as it was; a trial whose
every checkpoint generation is corrupt starts again from the beginning and the grid finishes.

One small grid, stopped while its first trial trains (so that trial has checkpoints), is run
once; each test works on a copy of its run directory. The read-only directory and the full
disk need a mount (root with CAP_SYS_ADMIN: a read-only bind mount, a small tmpfs); without
one, the read-only case uses ``chmod`` (it stops a user who is not root) and the full disk is
skipped, saying why."""

import contextlib
import hashlib
import io
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest

from damptune import ConfigError, interrupt
from damptune.cli import main as damptune
from flows.tune import tune
from infra.stack import free_port
from tasks.report import GridIncomplete
from tasks.stores import StoreFault
from tasks.tracking import TrackingUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

NAME = "doors"
TINY = dict(networks=[2], algorithms=["geodamp"], models=["mlp"], trials=2, epochs=2,
            target_accuracy=0.45, checkpoint_seconds=3600.0, checkpoint_every=10,
            validation_seeds=0)
FLAGS = ["--networks", "2", "--algorithms", "geodamp", "--models", "mlp", "--trials", "2",
         "--epochs", "2", "--target", "0.45", "--checkpoint-seconds", "3600",
         "--checkpoint-every", "10", "--validation-seeds", "0", "--grid-name", NAME,
         "--no-progress"]


@pytest.fixture(scope="module")
def stopped_grid(tmp_path_factory, scheduler, prefect_harness):
    """The run directory of TINY, stopped once its first trial has written a checkpoint: its
    Optuna and MLflow stores, its checkpoints and work log, that trial left interrupted."""
    run_dir = tmp_path_factory.mktemp("doors") / "grid"
    watcher = threading.Thread(target=_stop_at_first_checkpoint, args=(run_dir,), daemon=True)
    watcher.start()
    try:
        with pytest.raises(GridIncomplete, match="interrupted"):
            tune(grid_name=NAME, run_dir=str(run_dir), cluster=scheduler, **TINY)
    finally:
        watcher.join(60)
        interrupt.clear()
    assert _generations(run_dir), "the stopped trial wrote no checkpoint"
    return run_dir


def _stop_at_first_checkpoint(run_dir: Path) -> None:
    """Ask the stop once a checkpoint exists (the trial trains on, then checkpoints again)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _generations(run_dir):
        time.sleep(0.1)
    interrupt.request("test: stop the grid while its first trial trains")


def _generations(run_dir: Path) -> list[Path]:
    """Every checkpoint generation (``trial-N.pt``, ``trial-N.pt~1``) under ``run_dir``."""
    found = (run_dir / "checkpoints").rglob("trial-*.pt*")
    return sorted(p for p in found if p.name.endswith((".pt", ".pt~1")))


def _copy(stopped_grid: Path, parent: Path) -> Path:
    """A copy of the grid's run directory as a finished process leaves it: each SQLite file
    whole, its write-ahead log folded in (this process still holds the grid's connections)."""
    for db in stopped_grid.glob("*.db"):
        conn = sqlite3.connect(db)
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.close()
        assert busy == 0, f"{db}: its log could not be folded in"
    run_dir = parent / "grid"
    shutil.copytree(stopped_grid, run_dir, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    return run_dir


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: its bytes' digest and its modification time."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                       p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(run_dir: Path, scheduler: str, **kw) -> tuple[StoreFault, int, str]:
    """The flow's error and ``damptune tune``'s exit status and stderr, for the grid rerun on
    ``run_dir``: each refused as a fault of the storage, never as bad input."""
    with pytest.raises(StoreFault) as info:
        tune(grid_name=NAME, run_dir=str(run_dir), cluster=scheduler, **{**TINY, **kw})
    assert not isinstance(info.value, ConfigError | ValueError), info.value
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = damptune(["tune", *FLAGS, "--run-dir", str(run_dir),
                         *(f"--{k.replace('_', '-')}={v}" for k, v in kw.items())])
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return info.value, code, err.getvalue()


SQLITE_WORDS = ("not a sound SQLite database", "file is not a database", "left as it is",
                "Restore it from a backup")


@pytest.mark.parametrize(("name", "words"), [
    ("optuna.db", ("(storage=", *SQLITE_WORDS, "the grid's searches then start anew")),
    ("mlflow.db", ("(tracking_uri=", *SQLITE_WORDS, "a new store is then made")),
    ("grid.json", ("is not the JSON object damptune writes", "left as it is",
                   "delete it (the run writes it again)")),
], ids=["optuna.db", "mlflow.db", "grid.json"])
def test_a_corrupt_store_is_refused_naming_it_and_left_as_it_is(stopped_grid, tmp_path,
                                                                 scheduler, name, words):
    run_dir = _copy(stopped_grid, tmp_path)
    store = run_dir / name
    with open(store, "r+b") as f:
        f.write(b"\xde\xad\xbe\xef" * 25)  # garbage over its first bytes (SQLite's header)
    before = _snapshot(run_dir)
    error, code, err = _refused(run_dir, scheduler)
    for expected in (str(store), *words):
        assert expected in str(error) and expected in err, (expected, str(error), err)
    assert code == 1 and "store fault" in err, (code, err)
    assert _snapshot(run_dir) == before  # the file byte for byte, and nothing else written


def _mount_works(tmp_path: Path) -> bool:
    """Whether this process may mount (root with CAP_SYS_ADMIN): a tiny tmpfs, unmounted."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    probe = tmp_path / "mount-probe"
    probe.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                      capture_output=True).returncode:
        return False
    subprocess.run(["umount", str(probe)], check=True)
    return True


@contextlib.contextmanager
def _mounted(*commands: list[str], target: Path):
    """Run the mount ``commands`` on ``target``; unmount it (lazily: a file left open) after."""
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


@contextlib.contextmanager
def _read_only(run_dir: Path, tmp_path: Path):
    """``run_dir`` read-only for this process: a read-only bind mount (EROFS) where it may
    mount, else its mode without write bits (EACCES), which stops a user who is not root."""
    if _mount_works(tmp_path):
        with _mounted(["mount", "--bind", str(run_dir), str(run_dir)],
                      ["mount", "-o", "remount,bind,ro", str(run_dir)], target=run_dir):
            yield "Read-only file system (EROFS)"
        return
    if os.geteuid() == 0:
        pytest.skip("root without CAP_SYS_ADMIN: chmod does not stop root, and no read-only "
                    "bind mount can be made")
    mode = run_dir.stat().st_mode
    run_dir.chmod(0o555)
    try:
        yield "Permission denied (EACCES)"
    finally:
        run_dir.chmod(mode)


def test_a_read_only_run_dir_is_refused_naming_it_and_left_as_it_was(stopped_grid, tmp_path,
                                                                      scheduler):
    run_dir = _copy(stopped_grid, tmp_path)
    before = _snapshot(run_dir)
    with _read_only(run_dir, tmp_path) as cause:
        error, code, err = _refused(run_dir, scheduler)
    for words in (f"run_dir={str(run_dir)!r}", cause, "a fault of the storage, not of the "
                  "input", "Nothing was run", "are kept as they were", "Make it writable"):
        assert words in str(error) and words in err, (words, str(error), err)
    assert code == 1 and "store fault" in err, (code, err)
    assert _snapshot(run_dir) == before


def test_a_full_disk_is_refused_as_a_fault_of_the_storage_and_keeps_the_grid(
        stopped_grid, tmp_path, scheduler):
    """The grid's run directory on a small tmpfs, then the rest of it filled: a fault of the
    storage (the disk is full), not of the input; nothing written, every file kept."""
    if not _mount_works(tmp_path):
        pytest.skip("a full disk needs a small file system to fill: mounting a tmpfs needs "
                    "root with CAP_SYS_ADMIN (RLIMIT_FSIZE gives EFBIG, not ENOSPC)")
    disk = tmp_path / "disk"
    disk.mkdir()
    size = sum(p.stat().st_size for p in stopped_grid.rglob("*") if p.is_file())
    with _mounted(["mount", "-t", "tmpfs", "-o", f"size={size + (4 << 20)}", "tmpfs",
                   str(disk)], target=disk):
        run_dir = _copy(stopped_grid, disk)
        _fill(disk / "filler")
        before = _snapshot(run_dir)
        error, code, err = _refused(run_dir, scheduler)
        for words in (f"run_dir={str(run_dir)!r}", "No space left on device (ENOSPC)",
                      "The disk is full: a fault of the storage, not of the input",
                      "are kept as they were", "Free space there"):
            assert words in str(error) and words in err, (words, str(error), err)
        assert code == 1 and "store fault" in err, (code, err)
        assert _snapshot(run_dir) == before


def _fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    with open(path, "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        with contextlib.suppress(OSError):  # what the buffer still holds: a partial page
            f.flush()


def test_every_checkpoint_generation_corrupt_restarts_the_trial_and_the_grid_finishes(
        stopped_grid, tmp_path, scheduler, caplog):
    """The stopped trial's every generation overwritten with garbage, then the grid rerun: the
    trial starts again from the beginning and its log says so (it failed, before), the
    corrupt files are kept aside, and every trial of the grid finishes."""
    run_dir = _copy(stopped_grid, tmp_path)
    generations = _generations(run_dir)
    for path in generations:
        path.write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="damptune.checkpoint"):
        tune(grid_name=NAME, run_dir=str(run_dir), cluster=scheduler, **TINY)
    restarts = [r.getMessage() for r in caplog.records if r.name == "damptune.checkpoint"
                and "starts again from the beginning" in r.getMessage()]
    assert len(restarts) == 1, [r.getMessage() for r in caplog.records]
    assert f"{len(generations)} generation(s) are corrupt" in restarts[0], restarts
    assert all(Path(f"{p}.unreadable").read_bytes() == b"not a checkpoint"
               for p in generations)
    storage = f"sqlite:///{run_dir}/optuna.db"
    study = optuna.load_study(study_name=f"{NAME}/n2/geodamp/mlp", storage=storage)
    assert [(t.number, t.state.name in ("COMPLETE", "PRUNED")) for t in study.trials] == [
        (0, True), (1, True)], [(t.number, t.state.name) for t in study.trials]


@contextlib.contextmanager
def _dropping_server():
    """A port that accepts each connection and closes it at once, counting them: an MLflow
    that is down behind a proxy."""
    sock = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = sock.accept()
                accepted.append(1)
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", accepted
    finally:
        sock.close()


@pytest.mark.parametrize("down", ["closed port", "connections dropped"])
def test_mlflow_down_at_the_start_is_refused_before_any_trial(tmp_path, scheduler, down,
                                                               monkeypatch):
    """MLflow does not answer when the grid starts: one request (MLflow's own retries made
    none here, as test_resume's outage test does), then an error that names the URI and the
    cause, before anything is written (no Optuna storage, no trial). Not the outage mid-grid
    (test_resume), which is ridden out by the trials' retries."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    run_dir = tmp_path / "fresh"
    with contextlib.ExitStack() as stack:
        if down == "closed port":
            uri, accepted = f"http://127.0.0.1:{free_port()}", None
        else:
            uri, accepted = stack.enter_context(_dropping_server())
        error, code, err = _refused(run_dir, scheduler, tracking_uri=uri)
        assert accepted is None or len(accepted) == 2, accepted  # one request per door
    assert isinstance(error, TrackingUnavailable), error
    for words in (f"MLflow at tracking_uri={uri!r} did not answer at the grid's start",
                  "not of the input", "no trial was asked and nothing was written"):
        assert words in str(error) and words in err, (words, str(error), err)
    if down == "closed port":
        assert "Connection refused" in str(error), error
    assert code == 1 and "store fault" in err, (code, err)
    assert not run_dir.exists()  # no Optuna storage, no trial: nothing at all
