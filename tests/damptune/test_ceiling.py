"""The cost model's ceiling (damptune.ceiling): Amdahl's bound on a damped speedup from the
per-epoch speedup at the cap (s) and the share of the baseline's time after the first growth
(φ), on the network profiles the grid uses."""

import math

import pytest

from damptune import ConfigError
from damptune.ceiling import ceiling, epoch_speedup, first_damping, first_growth, growth_share
from damptune.netmodel import DEFAULT_PROFILE, PROFILES, CostModel, get_profile


def cost_on(profile: str) -> CostModel:  # the MLP's size and a calibration of this machine
    return CostModel(network=get_profile(profile), n_params=15_210, compute_fixed=0.37e-3,
                     compute_per_example=1e-9)


def test_epoch_speedup_is_an_epoch_at_b0_on_one_rank_over_an_epoch_at_the_cap():
    cost = cost_on("decentralized-moderate")
    b0_epoch = math.ceil(4000 / 32) * cost.update_seconds(batch_size=32, n_ranks=1)
    cap_epoch = math.ceil(4000 / 512) * cost.update_seconds(batch_size=512, n_ranks=16)
    assert epoch_speedup(cost, examples=4000, initial_batch=32, per_worker_batch=32,
                         n_ranks=16) == pytest.approx(b0_epoch / cap_epoch)


def test_the_default_profile_is_the_engines_cluster_and_lets_n16_win_three_times_more():
    """The grid's default charges the engine's measured overhead, not the paper's Dask host:
    at n16 an epoch at the cap is >= 3x faster than at B0 (the paper's profile: < 5x)."""
    assert DEFAULT_PROFILE == "ddp-100g" and DEFAULT_PROFILE in PROFILES
    net = get_profile(DEFAULT_PROFILE)
    assert net.overhead_per_rank_ms == 0 and net.overhead_ms < 1 and net.latency_us >= 1
    ours, paper = (epoch_speedup(cost_on(p), examples=4000, initial_batch=32,
                                 per_worker_batch=32, n_ranks=16)
                   for p in (DEFAULT_PROFILE, "decentralized-moderate"))
    assert ours > 2 * paper and paper < 5
    assert get_profile("decentralized-moderate").overhead_ms == 16.0  # the paper's, kept


def history(batches: list[int], *, target_at: int) -> list[dict]:
    """Update records of the given batches, then an evaluation; the accuracy reaches 0.9 at
    update ``target_at``."""
    out, seen = [], 0
    for i, b in enumerate(batches, start=1):
        seen += b
        out.append({"kind": "update", "update": i, "batch_size": b, "n_workers": 1,
                    "examples_seen": seen})
        out.append({"kind": "eval", "update": i, "examples_seen": seen,
                    "test_accuracy": 0.9 if i >= target_at else 0.1, "time_elapsed": 0.0})
    return out


def test_first_growth_is_the_examples_seen_before_the_batch_first_exceeds_b0():
    assert first_growth(history([32, 32, 32, 64, 64], target_at=5), initial_batch=32) == 96
    assert first_growth(history([64, 64], target_at=2), initial_batch=32) == 0
    assert first_growth(history([32, 32], target_at=2), initial_batch=32) is None


def test_first_damping_is_where_a_learning_rate_decay_begins_at_a_constant_batch():
    """The baseline's own trajectory: its batch stays B0 while its damping passes B0 (the
    decay), and that is where a damper growing by the same factor could first grow."""
    decaying = history([32] * 5, target_at=5)
    updates = [r for r in decaying if r["kind"] == "update"]
    for record, damping in zip(updates, [32, 32, 64, 64, 128], strict=True):
        record["damping"] = damping
    assert first_growth(decaying, initial_batch=32) is None
    assert first_damping(decaying, initial_batch=32) == 64
    assert first_damping(history([32, 32], target_at=2), initial_batch=32) is None


def test_growth_share_is_the_baselines_time_after_the_growth_point():
    cost = CostModel(network=get_profile("custom:100:0"), n_params=0, compute_fixed=1.0,
                     compute_per_example=0.0)  # one second per update
    baseline = history([32] * 10, target_at=8)  # reaches the target after 8 s
    assert growth_share(baseline, cost, target=0.9, growth_examples=2 * 32) == pytest.approx(
        6 / 8)
    assert growth_share(baseline, cost, target=0.9, growth_examples=0) == pytest.approx(1.0)
    assert growth_share(history([32] * 3, target_at=9), cost, target=0.9,
                        growth_examples=0) is None  # never reached: no share
    # a run timed on its whole budget (target None): the share of all of its 10 s
    assert growth_share(baseline, cost, target=None, growth_examples=2 * 32) == pytest.approx(
        8 / 10)


def test_ceiling_is_amdahls_law_and_refuses_impossible_inputs():
    assert ceiling(s=4.6, phi=0.3) == pytest.approx(1 / (0.7 + 0.3 / 4.6))
    assert ceiling(s=10.0, phi=0.0) == 1.0 and ceiling(s=10.0, phi=1.0) == pytest.approx(10.0)
    with pytest.raises(ConfigError, match="phi"):
        ceiling(s=2.0, phi=1.5)
