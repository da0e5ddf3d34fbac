"""Stragglers in the engine: seeded per-rank draws, a synchronous update waits for its slowest
rank, ``backup:B`` drops the B slowest ranks' gradients (every mode) and ``ssp:S`` computes
gradients on weights up to S updates stale (the parameter-server mode and its single-process
reference), in the real update math, resumed bit for bit."""

import numpy as np
import pytest

from damptune import ConfigError, TrainData, train
from damptune.netmodel import get_profile
from damptune.stragglers import AWS_5PCT, Stragglers
from damptune.tolerance import SspClock, parse_sync

from .test_checkpoint import assert_same_run, deterministic
from .test_modes import config

# compute given (not measured), so the simulated time is the same on every run
FIXED = dict(compute_per_example=1e-4, compute_fixed=1e-3, compute_forward_per_example=3e-5,
             compute_forward_fixed=0.0, compute_norm=0.0)
RANKS = 4


def _run(blobs, mode, scheduler=None, *, checkpoint_path=None, **kw):
    X, y, Xt, yt = blobs
    cfg = config(mode, RANKS, **{**FIXED, **kw})
    return train(cfg, TrainData.from_arrays(X, y, Xt, yt), cluster=scheduler,
                 checkpoint_path=checkpoint_path)


def _updates(state):
    return [r for r in state.history if r["kind"] == "update"]


def test_draws_are_a_function_of_seed_update_and_rank_alone():
    profile = Stragglers(p=0.3, slow_fraction=0.5, slow_factor=1.5)
    a = profile.factors(3, 17, 8)
    assert np.array_equal(a, profile.factors(3, 17, 8))  # no generator state between calls
    assert not np.array_equal(a, profile.factors(4, 17, 8))
    assert not np.array_equal(a, profile.factors(3, 18, 8))
    # a persistently slow rank stays slow as the ranks grow
    slow8, slow16 = profile.persistently_slow(3, 8), profile.persistently_slow(3, 16)
    assert np.array_equal(slow16[:8], slow8) and 0 < slow16.sum() < 16
    assert all(f >= 1.5 for f, s in zip(profile.factors(3, 17, 8), slow8, strict=True) if s)


@pytest.mark.parametrize("n_ranks", [1, 4, 16])
def test_the_expected_slowest_rank_is_the_mean_of_the_draws(n_ranks):
    draws = [AWS_5PCT.factors(0, u, n_ranks).max() for u in range(20_000)]
    assert AWS_5PCT.expected_slowest(n_ranks) == pytest.approx(np.mean(draws), rel=0.02)


def test_a_synchronous_update_waits_for_its_slowest_draw(blobs):
    calm = _run(blobs, "local", profile="ddp-100g")
    stormy = _run(blobs, "local", profile="aws-5pct")
    ups = _updates(stormy)
    assert [r["straggle"] for r in ups] == [
        float(AWS_5PCT.factors(7, r["update"] - 1, r["n_workers"]).max()) for r in ups]
    assert any(r["straggle"] > 1 for r in ups) and all(r["examples_dropped"] == 0 for r in ups)
    # the same training, update for update; only the simulated time (and what it waited) grows
    same = [{k: v for k, v in r.items() if k not in ("time_sim", "straggle")}
            for r in deterministic(calm.history)]
    assert same == [{k: v for k, v in r.items() if k not in ("time_sim", "straggle")}
                    for r in deterministic(stormy.history)]
    cost = stormy.config.cost_model(stormy.n_params)
    waited = sum(cost.compute_seconds(r["batch_size"], r["n_workers"]) * (r["straggle"] - 1)
                 for r in ups)
    assert stormy.time_sim - calm.time_sim == pytest.approx(waited, rel=1e-9) and waited > 0


@pytest.mark.parametrize(("mode", "zero"), [
    ("local", "backup:0"), ("centralized", "backup:0"), ("decentralized", "backup:0"),
    ("local", "ssp:0"), ("centralized", "ssp:0")])
def test_no_tolerance_is_sync_bit_for_bit(blobs, scheduler, mode, zero):
    sync = _run(blobs, mode, scheduler, profile="aws-5pct", sync="sync")
    assert_same_run(sync, _run(blobs, mode, scheduler, profile="aws-5pct", sync=zero))


@pytest.mark.parametrize("mode", ["local", "centralized", "decentralized"])
def test_backup_drops_the_slowest_ranks_gradients(blobs, scheduler, mode):
    state = _run(blobs, mode, scheduler, profile="aws-5pct", sync="backup:1")
    reference = _run(blobs, "local", profile="aws-5pct", sync="backup:1")
    ups = _updates(state)
    for r in ups:
        factors = AWS_5PCT.factors(7, r["update"] - 1, r["n_workers"])
        slowest = int(np.lexsort((np.arange(len(factors)), factors))[-1])
        shares = np.array_split(np.arange(r["batch_size"]), r["n_workers"])
        assert r["examples_dropped"] == len(shares[slowest])
        assert r["straggle"] == float(np.sort(factors)[-2])  # the second slowest arrived last
    used = [r["examples_seen"] for r in ups]
    assert used[-1] == sum(r["batch_size"] - r["examples_dropped"] for r in ups)
    # the ranks' math is the single process's (the dropped gradients never enter)
    np.testing.assert_allclose([r["loss"] for r in ups], [r["loss"] for r in _updates(reference)],
                               rtol=1e-5)
    assert len(ups) == len(_updates(reference))


@pytest.mark.parametrize("mode", ["local", "centralized"])
def test_a_backup_run_resumes_bit_identical(blobs, scheduler, tmp_path, mode):
    kw = dict(profile="aws-5pct", sync="backup:1", checkpoint_every=5)
    whole = _run(blobs, mode, scheduler, **kw)
    path = str(tmp_path / "part.pt")
    part = _run(blobs, mode, scheduler, max_updates=9, checkpoint_path=path, **kw)
    assert part.update == 9
    X, y, Xt, yt = blobs
    resumed = train(config(mode, RANKS, **{**FIXED, **kw}), TrainData.from_arrays(X, y, Xt, yt),
                    cluster=scheduler, checkpoint_path=path, resume=True)
    assert resumed.update == whole.update > 9
    assert_same_run(whole, resumed)


def _ssp_replay(ups, bound):
    """Each update's compute seconds and ranks' staleness, from the draws, by the formulas of
    damptune.tolerance written out over the whole history (not the engine's ring)."""
    finish, applied, out = [], [0.0], []  # applied[t]: U(t), U(0) = 0
    for r in ups:
        t, n = r["update"], r["n_workers"]
        factors = AWS_5PCT.factors(7, t - 1, n)
        c = r["_compute"]
        finish = finish[:n] + [applied[-1]] * (n - len(finish))
        gate = applied[t - bound - 1] if t - bound - 1 >= 0 else 0.0
        starts = [max(f, gate) for f in finish]
        stale = [sum(1 for k in range(max(1, t - bound), t) if applied[k] > s) for s in starts]
        finish = [s + c * f for s, f in zip(starts, factors, strict=True)]
        applied.append(max(finish))
        out.append((applied[-1] - applied[-2], tuple(stale) if any(stale) else ()))
    return out


def test_the_ssp_clock_lets_a_rank_ahead_absorb_its_own_straggle():
    clock = SspClock()
    steps = [clock.step(np.array(f, dtype=float), 1.0, 2)
             for f in ([1, 1], [3, 1], [1, 1], [1, 1], [1, 2.5], [1, 1])]
    # rank 0's straggle holds update 2 (3 s); rank 1 computes ahead on stale weights, and
    # absorbs its own 2.5x straggle later: that update takes 1 s, not 2.5
    assert [s for s, _ in steps] == [1.0, 3.0, 1.0, 1.0, 1.0, 1.0]
    assert [a for _, a in steps] == [[0, 0], [0, 0], [0, 1], [0, 2], [0, 2], [0, 1]]
    fresh = SspClock()
    assert [fresh.step(np.ones(3), 0.5, 2) for _ in range(4)] == [(0.5, [0, 0, 0])] * 4


@pytest.mark.parametrize("mode", ["local", "centralized"])
def test_ssp_computes_gradients_on_stale_weights_as_the_draws_say(blobs, scheduler, mode):
    state = _run(blobs, mode, scheduler, profile="aws-5pct", sync="ssp:2")
    sync = _run(blobs, mode, scheduler, profile="aws-5pct", sync="sync")  # the same mode
    reference = _run(blobs, "local", profile="aws-5pct", sync="ssp:2")
    cost = state.config.cost_model(state.n_params)
    ups = [{**r, "_compute": cost.compute_seconds(r["batch_size"], r["n_workers"])}
           for r in _updates(state)]
    replay = _ssp_replay(ups, 2)
    assert [r["staleness"] for r in ups] == [stale for _, stale in replay]
    assert [r["straggle"] * r["_compute"] for r in ups] == pytest.approx(
        [seconds for seconds, _ in replay], rel=1e-9)
    assert sum(1 for r in ups if r["staleness"]) > 3 and max(
        max(r["staleness"], default=0) for r in ups) == 2
    # stale gradients change the training; the parameter server's math is the reference's
    losses = [r["loss"] for r in ups]
    first = next(i for i, r in enumerate(ups) if r["staleness"])  # sync's math until then
    assert first > 0 and losses[:first] == [r["loss"] for r in _updates(sync)][:first]
    assert losses[first] != _updates(sync)[first]["loss"]  # its loss is on stale weights
    np.testing.assert_allclose(losses, [r["loss"] for r in _updates(reference)], rtol=1e-5)
    assert state.time_sim < sync.time_sim  # the stragglers' waits overlap


@pytest.mark.parametrize("mode", ["local", "centralized"])
def test_an_ssp_run_resumes_bit_identical(blobs, scheduler, tmp_path, mode):
    kw = dict(profile="aws-5pct", sync="ssp:2", checkpoint_every=5)
    whole = _run(blobs, mode, scheduler, **kw)
    path = str(tmp_path / "part.pt")
    assert _run(blobs, mode, scheduler, max_updates=13, checkpoint_path=path, **kw).update == 13
    X, y, Xt, yt = blobs
    resumed = train(config(mode, RANKS, **{**FIXED, **kw}), TrainData.from_arrays(X, y, Xt, yt),
                    cluster=scheduler, checkpoint_path=path, resume=True)
    assert resumed.update == whole.update > 13
    assert_same_run(whole, resumed)


def test_ssp_is_refused_with_all_reduce():
    with pytest.raises(ConfigError, match="sync='ssp:2'.*parameter-server"):
        config("decentralized", 2, sync="ssp:2").validate()


@pytest.mark.parametrize("sync", ["backup", "backup:-1", "ssp", "ssp:x", "async", 2])
def test_a_bad_sync_is_refused_naming_it(sync):
    with pytest.raises(ConfigError, match="sync") as refused:
        parse_sync(sync)
    assert "backup:B" in str(refused.value)
    with pytest.raises(ConfigError, match="sync"):
        config("local", 1, sync=sync).validate()


def test_aws_5pct_is_ddp_100g_with_stragglers():
    aws, ddp = get_profile("aws-5pct"), get_profile("ddp-100g")
    assert aws.stragglers == AWS_5PCT and ddp.stragglers is None
    assert (aws.bandwidth_gbps, aws.latency_us, aws.overhead_ms) == (
        ddp.bandwidth_gbps, ddp.latency_us, ddp.overhead_ms)


def test_damptune_train_takes_a_straggler_profile_and_a_sync(tmp_path):
    """`damptune train --profile aws-5pct --sync backup:1` drops gradients (its checkpoint's
    records say which); a sync the mode cannot run exits 2 naming it."""
    import subprocess
    import sys

    from damptune import load_checkpoint

    args = [sys.executable, "-m", "damptune", "train", "--model", "mlp", "--epochs", "1",
            "--workers", "4", "--min-workers", "4", "--per-worker-batch", "8", "--mode",
            "local", "--no-progress", "--json", "--profile", "aws-5pct"]
    ckpt = tmp_path / "run.pt"
    out = subprocess.run([*args, "--sync", "backup:1", "--checkpoint", str(ckpt)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"sync": "backup:1"' in out.stdout
    ups = [r for r in load_checkpoint(str(ckpt))["history"] if r["kind"] == "update"]
    assert ups and all(r["examples_dropped"] > 0 for r in ups)
    decentralized = [a if a != "local" else "decentralized" for a in args]
    refused = subprocess.run([*decentralized, "--sync", "ssp:2"], capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2 and "sync='ssp:2'" in refused.stderr, refused.stderr
