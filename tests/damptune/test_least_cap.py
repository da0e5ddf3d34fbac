"""A run trains the same under every cap at least its least cap (``least_cap``), with one
``training_digest``; under a smaller cap it trains otherwise, and its least cap is None."""

import pytest

from damptune import TrainConfig, TrainData, train
from damptune.config import least_cap, training_digest

# what a run computes and simulates (measured wall-clock times aside)
FIELDS = ("kind", "update", "examples_seen", "batch_size", "lr", "damping", "n_workers", "loss",
          "grad_sq_norm", "time_sim", "test_accuracy", "test_loss")


def _config(cap, workers, damper="geodamp", **kw):
    kw = {"seed": 7, "compute_per_example": 2e-5, "max_epochs": 3, **kw}
    return TrainConfig(
        module="models.mlp:MLP", module_kwargs={"input_shape": (12,), "n_classes": 3,
                                                "hidden": 32},
        optimizer_kwargs={"momentum": 0.9}, lr=0.05, damper=damper,
        damper_kwargs={"initial": 16, "factor": 2, "delay": 1}, max_batch_size=cap,
        per_worker_batch=8, max_workers=workers,
        compute_fixed=1e-4, compute_forward_per_example=7e-6,
        compute_forward_fixed=5e-5, compute_norm=2e-5, **kw)


def _trajectory(state):
    return [{k: r[k] for k in FIELDS if k in r} for r in state.history]


@pytest.fixture(scope="module")
def data(blobs):
    return TrainData.from_arrays(*blobs)


def test_a_run_trains_the_same_under_every_cap_at_least_its_least_cap(data):
    wide = _config(256, 32)
    history = train(wide, data).history
    cap = least_cap(wide, history)
    assert cap == 64  # 16, 32, 64: one doubling per epoch, 3 epochs
    fitting = _config(cap, cap // 8, checkpoint_seconds=5.0, max_time_sim=1e6)
    assert training_digest(fitting) == training_digest(wide)
    assert _trajectory(train(fitting, data)) == _trajectory(train(wide, data))


def test_a_run_its_cap_cut_trains_otherwise_and_has_no_least_cap(data):
    narrow = _config(32, 4)
    history = train(narrow, data).history
    assert least_cap(narrow, history) is None
    assert max(r["batch_size"] for r in history if r["kind"] == "update") == 32
    assert _trajectory(train(_config(256, 32), data)) != _trajectory(train(narrow, data))


def test_a_learning_rate_only_damper_needs_its_initial_batch_whatever_the_cap(data):
    config = _config(32, 4, damper="geodamplr")
    assert least_cap(config, train(config, data).history) == 16


def test_the_digest_follows_what_the_run_computes():
    base = training_digest(_config(64, 8))
    assert training_digest(_config(64, 8, seed=8)) != base
    assert training_digest(_config(64, 8, compute_per_example=3e-5)) != base
    assert training_digest(_config(64, 8, max_epochs=4)) != base
