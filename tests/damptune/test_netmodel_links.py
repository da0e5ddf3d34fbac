"""The network cost model against decentralized training on real, shaped links.

Each rank is a Dask worker process in its own network namespace; its traffic crosses veth
links shaped with tc (``infra/netns.py``). Needs root and Linux network namespaces: skipped,
with the reason, where they cannot be made. ``bench/network_model.py`` is the full benchmark.
"""

import statistics
import subprocess

import numpy as np
import pytest
from distributed import Client

from damptune import TrainConfig, TrainData, train
from damptune.netmodel import CostModel, Network
from damptune.state import build_model
from infra import netns

GOAL = 0.20
RATES_MBIT = (50.0, 100.0)  # comm of 185 and 92 ms: the link, not the 2-core host, dominates
UPDATES, WARMUP = 15, 3


def require_namespaces() -> None:
    ok, why = netns.can_make_namespaces()
    if not ok:
        pytest.skip(f"cannot build shaped links: {why}")


def leftovers(prefix: str) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [w for w in (names + links).replace(":", " ").replace("@", " ").split()
            if w.startswith(f"{prefix}-")]


def config(n_ranks: int) -> TrainConfig:
    return TrainConfig(
        module="models.mlp:MLP",
        module_kwargs={"input_shape": (40,), "n_classes": 10, "hidden": 512, "depth": 2},
        optimizer_kwargs={"momentum": 0.9}, lr=0.01, damper="sgd",
        damper_kwargs={"initial": 128 * n_ranks}, max_batch_size=128 * n_ranks,
        per_worker_batch=128, min_workers=n_ranks, max_workers=n_ranks, max_epochs=1e6,
        max_updates=UPDATES, eval_every=1e6, mode="decentralized", timeout=120,
    )


def test_shaped_network_removes_leftovers_and_cleans_up_on_error():
    require_namespaces()
    prefix = "dttest"
    subprocess.run(["ip", "netns", "add", f"{prefix}-h0"], check=False)  # as a crash leaves it
    with pytest.raises(RuntimeError, match="boom"), netns.shaped_network(
        2, rate_mbit=100, delay_ms=0, prefix=prefix
    ) as net:
        assert [h.address for h in net.hosts] == ["10.77.0.2", "10.77.0.3"]
        inside = subprocess.run(net.hosts[1].exec_argv(["ip", "-o", "-4", "addr", "show"]),
                                capture_output=True, text=True, check=True).stdout
        assert "10.77.0.3/24" in inside and net.hosts[1].ifname in inside
        qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", net.hosts[0].port],
                                capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdiscs and "100Mbit" in qdiscs
        raise RuntimeError("boom")
    assert leftovers(prefix) == []


@pytest.mark.slow
def test_comm_seconds_matches_decentralized_training_on_shaped_links(tmp_path):
    require_namespaces()
    delay_ms = 1.0 if netns.netem_available()[0] else 0.0
    rng = np.random.default_rng(0)
    data = TrainData.from_arrays(rng.normal(size=(2048, 40)).astype("float32"),
                                 rng.integers(0, 10, size=2048))
    cfg = config(2)
    n_params = sum(p.numel() for p in build_model(cfg).parameters())
    rows = []
    with netns.shaped_network(2, rate_mbit=RATES_MBIT[0], delay_ms=delay_ms,
                              prefix="dtlinks") as net, \
            netns.dask_on_network(net, workdir=tmp_path) as address, \
            Client(address, set_as_default=False) as client:
        for rate in RATES_MBIT:
            net = netns.reshape(net, rate_mbit=rate, delay_ms=delay_ms)
            state = train(cfg, data, cluster=client)
            updates = [r for r in state.history if r["kind"] == "update"][WARMUP:]
            assert len(updates) == UPDATES - WARMUP
            assert {r["n_workers"] for r in updates} == {2}
            measured = statistics.median(r["time_comm"] for r in updates)
            network = Network("shaped", bandwidth_gbps=net.bandwidth_gbps,
                              latency_us=net.latency_us)
            predicted = CostModel(network, n_params=n_params,
                                  compute_per_example=0.0).comm_seconds(2)
            rows.append((rate, predicted, measured, (predicted - measured) / measured))
    assert leftovers("dtlinks") == []
    report = "; ".join(f"{rate:g} Mbit/s, {delay_ms:g} ms: predicted {p * 1e3:.1f} ms, "
                       f"measured {m * 1e3:.1f} ms ({e:+.1%})" for rate, p, m, e in rows)
    assert all(abs(e) <= GOAL for *_, e in rows), report
