"""The three modes compute the same math: a single-process run is the oracle."""

from collections import Counter

import numpy as np
import pytest
import torch
from distributed import Client, WorkerPlugin

from damptune import TrainConfig, TrainData, train


def config(mode, workers, **kw):
    base = dict(
        module="models.mlp:MLP",
        module_kwargs={"input_shape": (12,), "n_classes": 3, "hidden": 32},
        optimizer_kwargs={"momentum": 0.9},
        lr=0.05,
        damper="geodamp",
        damper_kwargs={"initial": 16, "factor": 2, "delay": 1},
        max_batch_size=128,
        per_worker_batch=8,
        min_workers=workers,
        max_workers=workers,
        max_epochs=3,
        seed=7,
        mode=mode,
    )
    base.update(kw)
    return TrainConfig(**base)


def losses(state):
    return np.array([r["loss"] for r in state.history if r["kind"] == "update"])


@pytest.fixture(scope="module")
def reference(blobs):
    X, y, Xt, yt = blobs
    return train(config("local", 1), TrainData.from_arrays(X, y, Xt, yt))


@pytest.mark.parametrize(("mode", "workers"), [
    ("centralized", 1), ("centralized", 2), ("centralized", 4),
    ("decentralized", 2), ("decentralized", 4),
])
def test_modes_match_single_process_reference(reference, blobs, scheduler, mode, workers):
    X, y, Xt, yt = blobs
    state = train(config(mode, workers), TrainData.from_arrays(X, y, Xt, yt), cluster=scheduler)
    updates = [r for r in state.history if r["kind"] == "update"]
    assert {r["n_workers"] for r in updates} == {workers}
    assert len(updates) == len(losses(reference))
    np.testing.assert_allclose(losses(state), losses(reference), rtol=1e-5)
    for a, b in zip(state.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-6)
    accs = [r["test_accuracy"] for r in state.history if r["kind"] == "eval"]
    ref_accs = [r["test_accuracy"] for r in reference.history if r["kind"] == "eval"]
    assert accs == ref_accs


CHECKED = dict(target_accuracy=0.97, eval_resolution=0.02, eval_dense_margin=0.06)


def _evals(state):
    return [(r["update"], r["test_accuracy"]) for r in state.history if r["kind"] == "eval"]


@pytest.mark.parametrize(("mode", "workers"), [("centralized", 1), ("decentralized", 2)])
def test_checks_match_the_single_process_reference(blobs, scheduler, mode, workers):
    """An evaluation far below the target is a check in every mode alike: one process stops it
    early, P ranks evaluate their shards and sum; the same records, the same crossing."""
    X, y, Xt, yt = blobs
    data = TrainData.from_arrays(X, y, Xt, yt)
    reference = train(config("local", 1, **CHECKED), data)
    every = train(config("local", 1, eval_checks=False, **CHECKED), data)
    state = train(config(mode, workers, **CHECKED), data, cluster=scheduler)
    assert state.target_reached and reference.target_reached
    assert _evals(state) == _evals(reference)
    assert set(_evals(reference)) < set(_evals(every))  # the checks recorded nothing
    assert all(acc >= 0.97 - 0.06 for _, acc in _evals(reference))


class TasksPerKind(WorkerPlugin):
    """Counts the tasks each worker finished, by function name (the key's prefix)."""

    name = "tasks-per-kind"

    def setup(self, worker):
        self.counts = Counter()

    def transition(self, key, start, finish, **kwargs):
        if finish == "memory" and isinstance(key, str):
            self.counts[key.split("-", 1)[0]] += 1


def _run_counting_tasks(scheduler, cfg, data, callback=None, workers=None):
    """Train on the cluster; the state and, per worker, the tasks it ran by function name."""
    with Client(scheduler, timeout="10s") as client:
        client.register_plugin(TasksPerKind())
        try:
            state = train(cfg, data, cluster=scheduler, callback=callback, workers=workers)
            per_worker = client.run(lambda dask_worker: Counter(
                dask_worker.plugins["tasks-per-kind"].counts))
        finally:
            client.unregister_worker_plugin("tasks-per-kind")
    return state, per_worker


@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_ranks_follow_batch_size(blobs, scheduler, mode):
    """P = clip(ceil(B / per_worker_batch), min_workers, max_workers): the group of 4 ranks is
    formed once, and P = 1, 2, 4 train on its subgroups; the ranks change P among themselves
    (no task of the driver's per change: only segments, which every rank runs)."""
    X, y, Xt, yt = blobs
    cfg = config(mode, 4, min_workers=1, per_worker_batch=16, max_epochs=4)
    state, per_worker = _run_counting_tasks(scheduler, cfg, TrainData.from_arrays(X, y, Xt, yt))
    counts = sum(per_worker.values(), Counter())
    pairs = {(r["batch_size"], r["n_workers"]) for r in state.history if r["kind"] == "update"}
    assert pairs == {(16, 1), (32, 2), (64, 4), (128, 4)}
    assert counts["rank_setup"] == 4, counts  # one group of max_workers ranks, formed once
    # data (TrainData), rendezvous, formation, segments, sync, teardown: nothing per change
    assert set(counts) <= {"TrainData", "open_store", "rank_setup", "rank_advance",
                           "rank_checkpoint", "rank_teardown"}, counts
    assert counts["rank_advance"] % 4 == 0, counts  # every segment runs on every rank
    np.testing.assert_allclose(
        losses(state),
        losses(train(config("local", 1, per_worker_batch=16, max_epochs=4),
                     TrainData.from_arrays(X, y, Xt, yt))),
        rtol=1e-5,
    )


@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_evaluations_that_travel_with_the_segment_give_the_same_run_in_one_segment(
        reference, blobs, scheduler, mode):
    """eval_flush=False: a regular evaluation no longer ends the ranks' segment (one Dask task
    per rank and a round trip to the driver each). The callback sees the same records in the
    same order, and the run still equals the single-process oracle; with flush_seconds out of
    reach, the whole run is one segment."""
    data = TrainData.from_arrays(*blobs)
    runs = {}
    for flush in (True, False):
        seen = []
        cfg = config(mode, 2, eval_flush=flush, flush_seconds=3600.0,
                     compute_per_example=1e-4, compute_fixed=0.0)
        state, per_worker = _run_counting_tasks(scheduler, cfg, data, callback=seen.append)
        runs[flush] = ([(type(r).__name__, r.update, getattr(r, "loss", None),
                         getattr(r, "test_accuracy", None), r.time_sim) for r in seen],
                       sum(per_worker.values(), Counter())["rank_advance"])
        np.testing.assert_allclose(losses(state), losses(reference), rtol=1e-5)
        assert ([r["test_accuracy"] for r in state.history if r["kind"] == "eval"]
                == [r["test_accuracy"] for r in reference.history if r["kind"] == "eval"])
    (with_flush, segments_flushed), (without, segments) = runs[True], runs[False]
    assert sum(kind == "EvalRecord" for kind, *_ in with_flush) == 3  # one per epoch
    assert without == with_flush
    assert segments == 2, segments  # one segment, on each of the 2 ranks
    assert segments_flushed >= 2 * 3, segments_flushed  # a segment per evaluation


@pytest.mark.parametrize("given", [True, False])
def test_the_data_goes_only_to_the_workers_the_ranks_train_on(blobs, scheduler, given):
    """A run of 2 ranks on a cluster of 4 workers, given 2 of them (a trial of a grid that
    shares its cluster) or all of them (``damptune train``, the estimator), sends its data to
    the 2 workers its ranks train on: the others receive nothing and run nothing of it."""
    with Client(scheduler, timeout="10s") as client:
        mine = sorted(client.scheduler_info()["workers"])[:2] if given else None
    _, per_worker = _run_counting_tasks(scheduler, config("centralized", 2),
                                        TrainData.from_arrays(*blobs), workers=mine)
    assert len(per_worker) == 4
    ranks = {w for w, counts in per_worker.items() if counts.get("rank_setup")}
    assert len(ranks) == 2 and (not given or ranks == set(mine)), per_worker
    assert {w for w, counts in per_worker.items() if counts.get("TrainData")} == ranks
    assert all(not counts for w, counts in per_worker.items() if w not in ranks), per_worker


def test_history_records_carry_documented_fields(reference):
    update_keys = {"update", "epoch", "examples_seen", "batch_size", "lr", "damping",
                   "n_workers", "loss", "time_compute", "time_comm", "time_update"}
    updates = [r for r in reference.history if r["kind"] == "update"]
    assert all(update_keys <= r.keys() for r in updates)
    assert [r["update"] for r in updates] == list(range(1, len(updates) + 1))
    evals = [r for r in reference.history if r["kind"] == "eval"]
    assert [round(r["epoch"]) for r in evals] == [1, 2, 3]
    assert evals[-1]["test_accuracy"] > 0.9
