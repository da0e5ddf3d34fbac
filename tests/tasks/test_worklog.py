"""The work log measures what a kill really cost: a real training process is SIGKILLed between
checkpoints, the next attempt resumes from the checkpoint, and the lost work it records is the
gap between the dead process's last update and that checkpoint — no more than one interval
(here in updates, so the bound is a count, not a duration)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from damptune import TrainData, load_checkpoint, train
from infra.stack import REPO_ROOT
from tasks.worklog import WorkLog, summary
from tests.problems import blobs

EVERY = 200  # checkpoint_every: updates between checkpoints

CHILD = textwrap.dedent("""
    import sys
    from damptune import TrainData, train
    from tasks.worklog import WorkLog
    sys.path.insert(0, "tests/tasks")
    from test_worklog import make_config
    from tests.problems import blobs

    with WorkLog(sys.argv[1], "n2/geodamp/mlp", 0) as log:
        train(make_config(), TrainData.from_arrays(*blobs()), callback=log.record,
              checkpoint_path=sys.argv[2], resume=True)
""")


def make_config():
    from damptune import TrainConfig

    return TrainConfig(module="models.mlp:MLP",
                       module_kwargs={"input_shape": (12,), "n_classes": 3, "hidden": 32},
                       lr=0.05, damper="geodamp",
                       damper_kwargs={"initial": 8, "factor": 2, "delay": 50},
                       max_batch_size=64, per_worker_batch=8, min_workers=1, max_workers=1,
                       max_epochs=2000, seed=3, mode="local", checkpoint_every=EVERY)


def live_line(log):
    """The live line of the trial's attempt: (latest update, training seconds so far)."""
    try:
        with open(log.live_path) as f:
            update, elapsed = f.read().split()
        return int(update), float(elapsed)
    except (FileNotFoundError, ValueError):
        return 0, 0.0


def live_update(log):
    return live_line(log)[0]


def test_lost_work_after_a_sigkill_is_measured_and_within_one_interval(tmp_path):
    run_dir, ckpt = str(tmp_path / "run"), str(tmp_path / "trial-0.pt")
    log = WorkLog(run_dir, "n2/geodamp/mlp", 0)
    child = subprocess.Popen([sys.executable, "-c", CHILD, run_dir, ckpt], cwd=REPO_ROOT,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not os.path.exists(f"{ckpt}~1"):
        time.sleep(0.05)  # two checkpoints written: training is in full swing
    assert os.path.exists(f"{ckpt}~1"), "the child never checkpointed twice"
    while time.monotonic() < deadline and not EVERY / 4 <= live_update(log) % EVERY <= EVERY / 2:
        time.sleep(0.001)  # kill between two checkpoints
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)

    dead_update, dead_elapsed = live_line(log)  # how far the killed process got
    saved = load_checkpoint(ckpt)
    assert dead_update > saved["counters"]["update"] > 0
    assert saved["counters"]["update"] % EVERY == 0  # the newest checkpoint of the dead run

    with log:  # the next attempt: resumes, then stops (interrupted) at once
        state = train(make_config(), TrainData.from_arrays(*blobs()), callback=log.record,
                      checkpoint_path=ckpt, resume=True, should_stop=lambda: "test: stop")
    assert state.interrupted
    second = log.attempt
    assert second["attempt"] == 2 and second["resumed_at"] == saved["counters"]["update"]
    assert second["lost_updates"] == dead_update - saved["counters"]["update"]
    assert 0 < second["lost_updates"] <= EVERY, second  # at most one interval
    # the seconds lost are the dead process's training clock past the checkpoint's, as logged
    # (a difference of recorded values, not a duration this test times)
    lost = dead_elapsed - saved["counters"]["time_elapsed"]
    assert second["lost_seconds"] == pytest.approx(lost, abs=1e-6), (second, lost)

    with log:  # after an interrupted (checkpointed) attempt nothing is lost
        train(make_config(), TrainData.from_arrays(*blobs()), callback=log.record,
              checkpoint_path=ckpt, resume=True, should_stop=lambda: "test: stop")
    assert log.attempt["attempt"] == 3 and log.attempt["lost_updates"] == 0
    totals = summary(run_dir)[("n2/geodamp/mlp", 0)]
    assert totals["attempts"] == 3 and totals["lost_updates"] == second["lost_updates"]
    assert totals["max_lost_updates"] == second["lost_updates"]
