"""Spot-cluster resilience of the engine: checkpoint cadence and generations, interruption
(a caller, a deadline, SIGTERM), and lost Dask workers in both modes."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from distributed import Client, wait

from damptune import ClusterError, TrainData, interrupt, load_checkpoint, train
from damptune.checkpoint import checkpoint_paths
from damptune.cluster import gather_within, local_cluster
from tests.segments import act_inside_a_segment

from .test_checkpoint import assert_same_run
from .test_modes import config

KW = dict(min_workers=1, per_worker_batch=16, damper="padadamp",
          damper_kwargs={"initial": 16, "rate": 0.5}, max_epochs=3)


def data_of(blobs):
    X, y, Xt, yt = blobs
    return TrainData.from_arrays(X, y, Xt, yt)


def test_checkpoints_by_time_keep_generations(blobs, tmp_path):
    path = str(tmp_path / "c.pt")
    train(config("local", 4, checkpoint_seconds=1e-4, checkpoint_keep=3, **KW), data_of(blobs),
          checkpoint_path=path)
    files = checkpoint_paths(path, 3)
    assert all(os.path.exists(f) for f in files)
    updates = [load_checkpoint(f)["counters"]["update"] for f in files]
    assert updates[0] > updates[1] > updates[2]  # newest first, one per interval


def test_corrupt_newest_checkpoint_falls_back_to_previous(blobs, tmp_path, caplog):
    data = data_of(blobs)
    whole = train(config("local", 4, **KW), data)
    path = str(tmp_path / "c.pt")
    train(config("local", 4, max_updates=9, checkpoint_every=3, **KW), data,
          checkpoint_path=path)
    with open(path, "wb") as f:  # a partial write of the newest checkpoint
        f.write(b"\x80\x02truncated")
    with caplog.at_level(logging.WARNING, logger="damptune.checkpoint"):
        resumed = train(config("local", 4, **KW), data, checkpoint_path=path, resume=True)
    assert "unreadable checkpoint" in caplog.text
    assert_same_run(whole, resumed)


@pytest.mark.parametrize("mode", ["local", "centralized", "decentralized"])
def test_interrupted_run_resumes_identically(blobs, scheduler, tmp_path, mode):
    """The driver of the ranks is asked between segments (checkpoints, ~1 s flushes), the
    local loop after every update."""
    data = data_of(blobs)
    kw = {**KW, "max_epochs": 6, "checkpoint_every": 10}
    whole = train(config(mode, 4, **kw), data, cluster=scheduler)
    path = str(tmp_path / "c.pt")
    calls = []
    threshold = 9 if mode == "local" else 2

    def stop_after_a_while():
        calls.append(1)
        return "spot reclaim" if len(calls) >= threshold else None

    part = train(config(mode, 4, **kw), data, cluster=scheduler, checkpoint_path=path,
                 should_stop=stop_after_a_while)
    assert part.interrupted and "spot reclaim" in part.stopped
    assert 0 < part.update < whole.update
    resumed = train(config(mode, 4, **kw), data, cluster=scheduler, checkpoint_path=path,
                    resume=True)
    assert not resumed.interrupted
    assert_same_run(whole, resumed)


def test_a_stop_asked_during_training_checkpoints_where_it_stops(blobs, tmp_path):
    """A stop reason that comes mid-run (as the trial's lifetime limit does): training
    checkpoints at that update and ends interrupted."""
    seen: list[int] = []

    def on_record(record) -> None:
        if record.kind == "update":
            seen.append(record.update)

    # as the trial's stop does: a reason once the limit is near, here after the third update
    state = train(config("local", 4, **KW), data_of(blobs), callback=on_record,
                  should_stop=lambda: "the lifetime limit" if len(seen) >= 3 else None,
                  checkpoint_path=str(tmp_path / "c.pt"))
    assert state.interrupted and "lifetime" in state.stopped and state.update == 3
    assert load_checkpoint(str(tmp_path / "c.pt"))["counters"]["update"] == 3


@pytest.mark.parametrize("mode", ["local", "centralized"])
def test_a_run_past_its_deadline_before_it_starts_trains_nothing(blobs, scheduler, mode,
                                                                 tmp_path):
    """A trial started once the cluster's deadline has passed stops before its first
    update, in every mode: the ranks' first segment (~1 s) used to train on, and a short
    trial finished in it."""
    state = train(config(mode, 4, **KW), data_of(blobs), deadline=time.time() - 1,
                  cluster=None if mode == "local" else scheduler,
                  checkpoint_path=str(tmp_path / "c.pt"))
    assert state.interrupted and "lifetime" in state.stopped and state.update == 0
    assert [r for r in state.history if r["kind"] == "update"] == []


def test_interrupt_request_is_process_wide(blobs):
    interrupt.request("test")
    try:
        state = train(config("local", 4, **KW), data_of(blobs))
    finally:
        interrupt.clear()
    assert state.interrupted and state.update == 0  # asked before it began: none trained


def test_a_runs_first_ctrl_c_asks_the_stop_and_the_next_aborts(monkeypatch):
    """`damptune tune`'s SIGINT handler: the first Ctrl-C asks the stop (and says so), the
    second raises KeyboardInterrupt; where SIGINT is ignored (a background job of a shell
    without job control) it installs nothing."""
    said = []
    previous = signal.getsignal(signal.SIGINT)
    try:
        # as a terminal's program has it, whoever runs the suite (a background job of a
        # shell without job control inherits SIGINT ignored: the case the end of this covers)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert interrupt.install_sigint_handler(say=said.append)
        signal.raise_signal(signal.SIGINT)
        assert interrupt.requested() == "SIGINT (Ctrl-C)" and len(said) == 1
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert not interrupt.install_sigint_handler()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupt.clear()


def test_sigterm_checkpoints_and_resume_matches(tmp_path):
    """A real SIGTERM to `damptune train`: it checkpoints and exits; --resume finishes with the
    same weights as a run never interrupted."""
    args = [sys.executable, "-m", "damptune", "train", "--model", "mlp", "--dataset",
            "synthetic", "--damper", "padadamp", "--param", "rate=0.05", "--initial", "16",
            "--epochs", "200", "--mode", "local", "--json", "--no-progress"]
    whole = tmp_path / "whole.pt"
    out = subprocess.run(args + ["--checkpoint", str(whole)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    part = tmp_path / "part.pt"
    proc = subprocess.Popen(args + ["--checkpoint", str(part), "--checkpoint-seconds", "0.3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not part.exists() and time.monotonic() < deadline:  # training has started
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["interrupted"], stderr
    whole_updates = load_checkpoint(str(whole))["counters"]["update"]
    assert 0 < load_checkpoint(str(part))["counters"]["update"] < whole_updates  # mid-training
    out = subprocess.run(args + ["--checkpoint", str(part), "--resume"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    a, b = load_checkpoint(str(whole)), load_checkpoint(str(part))
    assert a["counters"]["update"] == b["counters"]["update"]
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name


@pytest.fixture
def fragile_cluster(tmp_path):
    """A cluster of its own: these tests kill its workers (the nanny restarts them)."""
    cluster = local_cluster(n_workers=3, local_directory=str(tmp_path / "dask"))
    yield cluster
    cluster.close()


def killer_at_update(scheduler, which, at_update=30):
    """A callback that SIGKILLs worker processes when the run reaches ``at_update`` (so the
    kill lands mid-run, whatever the machine's speed): ``which`` picks them from the sorted
    worker addresses."""
    done = []

    def callback(record):
        if done or record.update < at_update:
            return
        done.append(record.update)
        with Client(scheduler, timeout="10s") as client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
            pids = client.run(os.getpid, workers=which(workers))
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)

    callback.done = done
    return callback


def _rank_result():
    return torch.arange(1000.0)


@pytest.mark.slow
def test_a_result_lost_with_its_worker_raises_instead_of_waiting_for_ever(fragile_cluster):
    """A rank's task finished on a worker that is SIGKILLed before its result is fetched: the
    result is lost, and its task, pinned to the dead worker, can never run again. Waiting for
    it raises ClusterError (the trainer recovers from a lost worker) within seconds; it
    waited for ever before, and a grid on a spot cluster hung with it."""
    with Client(fragile_cluster.scheduler_address, timeout="10s") as client:
        worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
        pid = client.run(os.getpid, workers=[worker])[worker]
        future = client.submit(_rank_result, workers=[worker], allow_other_workers=False,
                               pure=False)
        wait([future])
        assert future.status == "finished"
        os.kill(pid, signal.SIGKILL)
        outcome = {}

        def fetch():
            try:
                outcome["results"] = gather_within([future], timeout=300, what="segment",
                                                   client=client, workers=[worker])
            except ClusterError as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        thread.join(90)
        assert not thread.is_alive(), "still waiting for the lost result 90 s after the kill"
        assert "results" not in outcome
        assert f"worker(s) ['{worker}'] left the cluster" in str(outcome["error"])


VICTIMS = {"one worker": lambda workers: workers[1:2], "every worker": lambda workers: workers}


@pytest.mark.slow
@pytest.mark.parametrize("victims", sorted(VICTIMS))
@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_lost_workers_do_not_fail_the_run(blobs, fragile_cluster, mode, victims, tmp_path,
                                          caplog):
    """Workers SIGKILLed mid-run (one, or every one: their nannies start new ones, with new
    addresses, and the data is sent again): the run ends with the same weights as an
    undisturbed one."""
    data = data_of(blobs)
    address = fragile_cluster.scheduler_address
    kw = {**KW, "max_epochs": 12, "checkpoint_every": 10}
    whole = train(config(mode, 2, **kw), data, cluster=address)
    killer = killer_at_update(address, VICTIMS[victims])
    with caplog.at_level(logging.WARNING, logger="damptune"):
        survived = train(config(mode, 2, **kw), data, cluster=address, callback=killer,
                         checkpoint_path=str(tmp_path / "c.pt"))
    assert killer.done and "lost" in caplog.text  # killed mid-run, and recovered from
    assert survived.update == whole.update
    for a, b in zip(whole.model.parameters(), survived.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_workers_lost_while_stopping_end_the_run_at_its_last_synced_update(
        blobs, fragile_cluster, tmp_path, caplog, monkeypatch):
    """A machine's shutdown signals every process (``timeout``, a process group's SIGTERM,
    systemd): the stop is asked and the ranks' workers die in the same segment. The run does
    not wait for replacements nor re-form its group (it waited for them, up to the grid's 600 s
    per trial, before): it ends interrupted at its last synced update, checkpointed there, and
    a resume ends with the undisturbed run's weights. The fault lands inside a segment: the
    stop is asked and the workers killed after the segment's tasks were submitted, before
    its results are awaited."""
    data, address = data_of(blobs), fragile_cluster.scheduler_address
    cfg = config("centralized", 2, **{**KW, "max_epochs": 12, "checkpoint_every": 10})
    whole = train(cfg, data, cluster=address)
    armed, killed = [], []

    def shutdown():
        interrupt.request("test: the machine shuts down")
        with Client(address, timeout="10s") as client:
            pids = client.run(os.getpid)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        killed.extend(pids)

    act_inside_a_segment(monkeypatch, lambda: bool(armed), shutdown)
    ckpt = str(tmp_path / "c.pt")
    with caplog.at_level(logging.WARNING, logger="damptune"):
        stopped = train(cfg, data, cluster=address, checkpoint_path=ckpt,
                        callback=lambda r: armed.append(r.update) if r.update >= 30 else None)
    interrupt.clear()
    assert len(killed) == 3 and stopped.interrupted, (killed, stopped.stopped)
    assert "while stopping" in caplog.text and "re-forming" not in caplog.text, caplog.text
    assert load_checkpoint(ckpt)["counters"]["update"] == stopped.update
    assert 0 < stopped.update < whole.update
    monkeypatch.undo()
    resumed = train(cfg, data, cluster=address, checkpoint_path=ckpt, resume=True)
    assert resumed.update == whole.update and not resumed.interrupted
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def terminator_at_update(scheduler, at_update=30):
    """A callback that sends SIGTERM (a preemption notice) to the process of the run's second
    worker at ``at_update``; it remembers the update and the worker."""
    done = []

    def callback(record):
        if done or record.update < at_update:
            return
        with Client(scheduler, timeout="10s") as client:
            worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[1]
            pid = client.run(os.getpid, workers=[worker])[worker]
        done.append((record.update, worker))
        os.kill(pid, signal.SIGTERM)

    callback.done = done
    return callback


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_sigterm_to_a_worker_checkpoints_retires_it_and_the_run_continues(
        blobs, fragile_cluster, mode, tmp_path):
    """A real SIGTERM to a real worker process (the preemption notice of SLURM and spot
    instances): the run checkpoints because of the notice (no other checkpoint is due before
    the end), the worker leaves the cluster gracefully (it is not restarted), and the run
    ends with the weights of an undisturbed one."""
    from damptune.preemption import PreemptionPlugin

    data = data_of(blobs)
    address = fragile_cluster.scheduler_address
    with Client(address, timeout="10s") as client:
        client.register_plugin(PreemptionPlugin())
    # no checkpoint but the notice's; segments of 0.05 s, so the driver sees the notice mid-run
    kw = {**KW, "max_epochs": 12, "checkpoint_seconds": 3600.0, "flush_seconds": 0.05}
    whole = train(config(mode, 2, **kw), data, cluster=address)
    ckpts = str(tmp_path / "c.pt")
    saved = []

    def watch_checkpoints(record):  # the first checkpoint written, as the run goes on
        if not saved and os.path.exists(ckpts):
            saved.append(load_checkpoint(ckpts)["counters"]["update"])
        terminator(record)

    terminator = terminator_at_update(address)
    survived = train(config(mode, 2, **kw), data, cluster=address, callback=watch_checkpoints,
                     checkpoint_path=ckpts)
    (_, victim), = terminator.done
    assert saved, "no checkpoint was written after the notice"
    assert saved[0] < whole.update  # the notice's checkpoint, not the final one
    with Client(address, timeout="10s") as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    assert victim not in workers and len(workers) == 2  # retired, not restarted by its nanny
    assert survived.update == whole.update
    for a, b in zip(whole.model.parameters(), survived.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
