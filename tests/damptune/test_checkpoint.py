"""A run stopped after update k and resumed from its checkpoint ends bit-identical."""

import os

import pytest
import torch

from damptune import (
    CheckpointError,
    ConfigError,
    TrainData,
    load_checkpoint,
    save_checkpoint,
    train,
)
from damptune.checkpoint import checkpoint_exists

from .test_modes import config


def deterministic(history):
    """History without measured times (the only fields that legitimately differ)."""
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in history]


def assert_same_run(a, b):
    for (na, pa), (nb, pb) in zip(a.model.state_dict().items(), b.model.state_dict().items(),
                                  strict=True):
        assert na == nb and torch.equal(pa, pb), f"{na} differs"
    for sa, sb in zip(a.optimizer.state_dict()["state"].values(),
                      b.optimizer.state_dict()["state"].values(), strict=True):
        assert torch.equal(sa["momentum_buffer"], sb["momentum_buffer"])
    assert deterministic(a.history) == deterministic(b.history)


@pytest.mark.parametrize("mode", ["local", "centralized", "decentralized"])
def test_resumed_run_is_bit_identical(blobs, scheduler, tmp_path, mode):
    X, y, Xt, yt = blobs
    data = TrainData.from_arrays(X, y, Xt, yt)
    kw = dict(min_workers=1, per_worker_batch=16, damper="padadamp",
              damper_kwargs={"initial": 16, "rate": 0.5}, max_epochs=3, checkpoint_every=7)
    whole = train(config(mode, 4, **kw), data, cluster=scheduler,
                  checkpoint_path=str(tmp_path / "whole.pt"))
    path = str(tmp_path / "part.pt")
    part = train(config(mode, 4, max_updates=11, **kw), data, cluster=scheduler,
                 checkpoint_path=path)
    assert part.update == 11
    assert load_checkpoint(path)["counters"]["update"] == 11
    resumed = train(config(mode, 4, **kw), data, cluster=scheduler, checkpoint_path=path,
                    resume=True)
    assert resumed.update == whole.update > 11
    assert len({r["n_workers"] for r in whole.history if r["kind"] == "update"}) > 1
    assert_same_run(whole, resumed)


def test_checkpoint_holds_everything_and_loads_weights_only(blobs, tmp_path):
    X, y, Xt, yt = blobs
    path = tmp_path / "c.pt"
    train(config("local", 1, max_updates=5), TrainData.from_arrays(X, y, Xt, yt),
          checkpoint_path=str(path))
    ckpt = torch.load(path, weights_only=True)
    assert {"model", "optimizer", "damper", "sampler", "counters", "rng", "config",
            "history"} <= ckpt.keys()
    assert ckpt["counters"]["update"] == 5
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_checkpoint_to_fsspec_url(blobs):
    X, y, Xt, yt = blobs
    url = "memory://damptune-test/run.pt"
    train(config("local", 1, max_updates=3), TrainData.from_arrays(X, y, Xt, yt),
          checkpoint_path=url)
    assert checkpoint_exists(url)
    resumed = train(config("local", 1, max_updates=6), TrainData.from_arrays(X, y, Xt, yt),
                    checkpoint_path=url, resume=True)
    assert resumed.update == 6
    assert [r["update"] for r in resumed.history if r["kind"] == "update"] == list(range(1, 7))


def test_checkpoint_of_another_config_is_refused_and_left_untouched(blobs, tmp_path):
    X, y, Xt, yt = blobs
    data = TrainData.from_arrays(X, y, Xt, yt)
    path = tmp_path / "c.pt"
    train(config("local", 1, max_updates=3), data, checkpoint_path=str(path))
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    other = config("local", 1, lr=0.5, module_kwargs={"input_shape": (12,), "n_classes": 3,
                                                        "hidden": 8})
    with pytest.raises(CheckpointError, match=r"lr: checkpoint has 0.05, run has 0.5") as err:
        train(other, data, checkpoint_path=str(path), resume=True)
    assert "module_kwargs" in str(err.value)
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="could not be read"):
        load_checkpoint(str(path))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(str(tmp_path / "missing.pt"))


def test_checkpoint_refuses_pickled_code(tmp_path):
    """weights_only: a checkpoint carrying an arbitrary object does not load."""
    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "payload": ConfigError("x", 1, "y")}, path)
    with pytest.raises(CheckpointError):
        load_checkpoint(str(path))


def test_bad_config_fails_before_touching_checkpoint(blobs, tmp_path):
    X, y, Xt, yt = blobs
    path = tmp_path / "c.pt"
    save_checkpoint(str(path), {"format": 1, "sentinel": torch.zeros(1)})
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="max_batch_size=8 .*batch_size__initial=16"):
        train(config("local", 1, max_batch_size=8), TrainData.from_arrays(X, y, Xt, yt),
              checkpoint_path=str(path), resume=True)
    assert path.read_bytes() == before
