import json
import math
import subprocess
import sys

import pytest

from damptune import ConfigError, TrainData, train
from damptune.netmodel import (
    DEFAULT_PROFILE,
    ENGINE_OVERHEAD_MS,
    NOT_REACHED,
    PROFILES,
    REPLAY_PROFILES,
    CostModel,
    Network,
    get_profile,
    parse_schedule,
    simulate_schedule,
    simulated_times,
    time_to_target,
)

from .test_modes import config

MB = 1_000_000


def test_ring_allreduce_formula():
    net = Network("n", bandwidth_gbps=8.0, latency_us=10.0)  # 1 GB/s
    assert net.comm_seconds(1, 4 * MB) == 0.0
    assert net.comm_seconds(2, 4 * MB) == pytest.approx(2 * (10e-6 + 2e-3))
    assert net.comm_seconds(4, 4 * MB) == pytest.approx(6 * (10e-6 + 1e-3))
    # the bandwidth term tends to 2 M / beta as P grows: ring all-reduce is bandwidth-optimal
    no_latency = Network("n0", bandwidth_gbps=8.0, latency_us=0.0)
    assert no_latency.comm_seconds(1000, 4 * MB) == pytest.approx(2 * 4e-3, rel=0.01)


def test_tree_and_parameter_server_formulas():
    tree = Network("t", 8.0, 10.0, algorithm="tree")
    assert tree.comm_seconds(8, 4 * MB) == pytest.approx(6 * (10e-6 + 4e-3))
    ps = Network("p", 8.0, 10.0, mode="centralized")
    assert ps.comm_seconds(1, 4 * MB) == pytest.approx(2 * (10e-6 + 4e-3))
    assert ps.comm_seconds(8, 4 * MB) == pytest.approx(16 * (10e-6 + 4e-3))


def test_named_profiles_from_the_paper():
    assert PROFILES["decentralized-moderate"].bandwidth_gbps == 54
    assert PROFILES["decentralized-moderate"].latency_us == 0.05
    assert PROFILES["decentralized-high"].bandwidth_gbps == 800
    assert PROFILES["centralized"].mode == "centralized"
    custom = get_profile("custom:10:5:tree")
    assert (custom.bandwidth_gbps, custom.latency_us, custom.algorithm) == (10, 5, "tree")
    assert (custom.overhead_ms, custom.overhead_per_rank_ms) == (0.0, 0.0)


def test_paper_reference_update_time():
    """WRN-16-4 on a T4: 78.3 ms per 128 examples, 11 ms overhead."""
    net = get_profile("decentralized-moderate").with_overhead(11.0, 0.0)
    cost = CostModel(net, 2_750_000, 0.612e-3)
    assert cost.update_seconds(batch_size=128, n_ranks=1) == pytest.approx(0.0893, rel=1e-3)
    assert cost.update_seconds(batch_size=640, n_ranks=5) > cost.update_seconds(
        batch_size=128, n_ranks=1)


def test_the_papers_profiles_charge_its_orchestration_overhead_per_rank():
    """16 ms + 3.3 ms per rank and update (the AdaDamp paper's simulations), on top of the
    compute and the exchange; it makes many ranks stop paying. The default profile charges
    the engine's own measured overhead instead."""
    assert (PROFILES[DEFAULT_PROFILE].overhead_ms,
            PROFILES[DEFAULT_PROFILE].overhead_per_rank_ms) == (ENGINE_OVERHEAD_MS, 0.0)
    for name in ("decentralized-moderate", "decentralized-high", "centralized"):
        net = PROFILES[name]
        assert (net.overhead_ms, net.overhead_per_rank_ms) == (16.0, 3.3)
        assert net.overhead_seconds(8) == pytest.approx(16e-3 + 8 * 3.3e-3)
    cost = CostModel(PROFILES["decentralized-high"], 1_000, 1e-5)
    bare = CostModel(PROFILES["decentralized-high"].with_overhead(0.0, 0.0), 1_000, 1e-5)
    for p in (1, 4, 16):
        assert cost.update_seconds(batch_size=32 * p, n_ranks=p) - bare.update_seconds(
            batch_size=32 * p, n_ranks=p) == pytest.approx((16 + 3.3 * p) * 1e-3)
    # per example, 16 ranks at 512 cost less than 1 rank at 32, but 16x the ranks cost more
    # than 16x the examples would alone: the per-rank term
    assert cost.update_seconds(batch_size=512, n_ranks=16) / 512 < cost.update_seconds(
        batch_size=32, n_ranks=1) / 32
    assert get_profile("custom:10:5:ring:2:1").overhead_seconds(3) == pytest.approx(5e-3)
    assert get_profile("custom:10:5").overhead_seconds(3) == 0.0
    with pytest.raises(ConfigError, match="overhead_per_rank_ms"):
        get_profile("custom:10:5:ring:2:-1")


def test_damper_work_is_charged_across_the_ranks():
    """AdaDamp's loss pass: a forward of its share per rank, an all-reduce of one number and
    one orchestration overhead; RadaDamp's norm: its measured seconds."""
    net = PROFILES["decentralized-moderate"]
    cost = CostModel(net, 1_000, 3e-5, forward_per_example=1e-5, forward_fixed=2e-4,
                     compute_norm=5e-5)
    plain = cost.update_seconds(batch_size=64, n_ranks=4)
    with_pass = cost.update_seconds(batch_size=64, n_ranks=4, damper_examples=1024)
    assert with_pass - plain == pytest.approx(
        2e-4 + 256 * 1e-5 + net.comm_seconds(4, 8) + net.overhead_seconds(4))
    assert cost.update_seconds(batch_size=64, n_ranks=4, norm=True) - plain == pytest.approx(
        5e-5)


def test_schedule_replay_counts_updates_and_ranks():
    cost = CostModel(get_profile("decentralized-high").with_overhead(0.0, 0.0), 1000, 1e-3)
    rows = simulate_schedule(parse_schedule("2x100, 1x1000"), examples=1050, cost=cost,
                             per_worker_batch=128)
    assert [r["updates"] for r in rows] == [2 * 11, 2 * 11 + 2]
    assert [r["n_workers"] for r in rows] == [1, 7]
    assert rows[-1]["seconds"] == pytest.approx(22 * 0.1 + 2 * (
        math.ceil(1000 / 7) * 1e-3 + get_profile("decentralized-high").comm_seconds(7, 4000)))


@pytest.mark.parametrize("bad", ["60x", "x128", "60*128", "0x128", "60x0", "", "60x128,,"])
def test_malformed_schedule_is_refused(bad):
    with pytest.raises(ConfigError, match="schedule"):
        parse_schedule(bad)


@pytest.mark.parametrize("bad", ["fast", "custom:x:1", "custom:0:1", "custom:1:-1"])
def test_unknown_or_invalid_profile_is_refused(bad):
    with pytest.raises(ConfigError):
        get_profile(bad)


def test_time_to_target_reached_and_not_reached():
    history = [
        {"kind": "update", "batch_size": 10, "n_workers": 1},
        {"kind": "eval", "test_accuracy": 0.5, "time_elapsed": 1.0, "update": 1,
         "examples_seen": 10},
        {"kind": "update", "batch_size": 10, "n_workers": 1},
        {"kind": "eval", "test_accuracy": 0.8, "time_elapsed": 2.0, "update": 2,
         "examples_seen": 20},
    ]
    cost = CostModel(get_profile("decentralized-high").with_overhead(0.0, 0.0), 10, 0.1)
    hit = time_to_target(history, cost, target=0.7)
    assert hit.reached and hit.simulated_seconds == pytest.approx(2.0) and hit.update == 2
    miss = time_to_target(history, cost, target=0.9)
    assert not miss.reached and miss.simulated_seconds == NOT_REACHED == math.inf
    with pytest.raises(ConfigError, match="history"):
        time_to_target(history[::2], cost, target=0.7)
    with pytest.raises(ConfigError, match="target"):
        time_to_target(history, cost, target=1.5)


def test_engine_records_carry_simulated_time(blobs):
    X, y, Xt, yt = blobs
    cfg = config("local", 4, min_workers=1, compute_per_example=1e-3, compute_fixed=0.0,
                 profile="centralized")
    state = train(cfg, TrainData.from_arrays(X, y, Xt, yt))
    cost = CostModel(get_profile("centralized"), state.n_params, 1e-3)
    expected = simulated_times(state.history, cost)
    assert [r["time_sim"] for r in state.history] == pytest.approx(expected)
    assert all(b >= a for a, b in zip(expected, expected[1:], strict=False))


def test_engine_calibrates_compute_when_not_given(blobs, tmp_path, monkeypatch):
    monkeypatch.setenv("DAMPTUNE_CACHE", str(tmp_path))
    X, y, Xt, yt = blobs
    cfg = config("local", 1, max_updates=3)
    state = train(cfg, TrainData.from_arrays(X, y, Xt, yt))
    assert state.config.compute_per_example > 0 and state.config.compute_fixed >= 0
    assert cfg.compute_per_example is None and cfg.n_train == 0  # the caller's is not changed
    assert (tmp_path / "compute.json").exists()


def simulate(*args):
    return subprocess.run([sys.executable, "-m", "damptune", "simulate", *args],
                          capture_output=True, text=True, timeout=120)


def test_simulate_cli_json_for_every_profile(tmp_path):
    out = simulate("--schedule", "60x128,60x640,80x3200", "--examples", "50000", "--params",
                   "2750000", "--compute-ms-per-example", "0.612", "--per-worker-batch", "128",
                   "--overhead-ms", "11", "--profile", "all", "--json", "--plot",
                   str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    # every named profile but a straggler one (its time needs the draws of a run trained on it)
    assert {r["profile"] for r in rows} == set(REPLAY_PROFILES) == set(PROFILES) - {"aws-5pct"}
    assert all(r["updates"] == 60 * 391 + 60 * 79 + 80 * 16 for r in rows)
    by = {r["profile"]: r["seconds"] for r in rows}
    assert by["decentralized-high"] < by["decentralized-moderate"] < by["centralized"]
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert all((r["overhead_ms"], r["overhead_per_rank_ms"])  # the flag's, else the profile's
               == (11.0, PROFILES[r["profile"]].overhead_per_rank_ms) for r in rows)
    out = simulate("--schedule", "60x128", "--examples", "50000", "--params", "2750000",
                   "--compute-ms-per-example", "0.612", "--per-worker-batch", "128",
                   "--overhead-ms", "0", "--overhead-per-rank-ms", "0")
    assert out.returncode == 0, out.stderr
    assert "overhead 0 ms + 0 ms per rank per update" in out.stdout
    refused = simulate("--schedule", "60x128", "--examples", "50000", "--params", "2750000",
                       "--compute-ms-per-example", "0.612", "--profile", "aws-5pct")
    assert refused.returncode == 2 and "--profile" in refused.stderr, refused.stderr
    assert "aws-5pct" in refused.stderr and "straggler" in refused.stderr, refused.stderr


def test_simulate_cli_history_from_checkpoint(blobs, tmp_path):
    X, y, Xt, yt = blobs
    path = tmp_path / "c.pt"
    train(config("local", 1, compute_per_example=1e-4, compute_fixed=0.0),
          TrainData.from_arrays(X, y, Xt, yt), checkpoint_path=str(path))
    out = simulate("--history", str(path), "--target", "0.5", "--profile", "all", "--json",
                   "--plot", str(tmp_path / "h.png"))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert all(r["reached"] and r["seconds"] > 0 for r in rows)
    low = tmp_path / "low.json"
    low.write_text(json.dumps([{"kind": "update", "batch_size": 8, "n_workers": 1},
                               {"kind": "eval", "test_accuracy": 0.3, "time_elapsed": 1.0,
                                "update": 1, "examples_seen": 8}]))
    out = simulate("--history", str(low), "--target", "0.9", "--json", "--params", "10",
                   "--compute-ms-per-example", "1")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["reached"] is False and json.loads(out.stdout)["seconds"] is None


def test_simulate_cli_errors_name_the_parameter():
    out = simulate("--schedule", "60xfoo", "--examples", "10", "--params", "1",
                   "--compute-ms-per-example", "1")
    assert out.returncode == 2 and "schedule='60xfoo'" in out.stderr
    out = simulate("--schedule", "1x1", "--examples", "-5", "--params", "1",
                   "--compute-ms-per-example", "1")
    assert out.returncode == 2 and "--examples=-5" in out.stderr
    out = simulate("--schedule", "1x1", "--examples", "5", "--params", "1")
    assert out.returncode == 2 and "--compute-ms-per-example" in out.stderr
