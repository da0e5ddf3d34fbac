"""The network cost model against decentralized training on real, shaped links: the bytes
each rank sends are those the model charges for (counted by the links' qdiscs, not timed).

Each rank is a Dask worker process in its own network namespace; its traffic crosses veth
links shaped with tc (``infra/netns.py``). Needs root and Linux network namespaces: skipped,
with the reason, where they cannot be made. ``bench/network_model.py`` is the full benchmark.
"""

import re
import statistics
import subprocess

import numpy as np
import pytest
from distributed import Client

from damptune import TrainConfig, TrainData, train
from damptune.netmodel import CostModel, Network
from damptune.state import build_model
from infra import netns

RATES_MBIT = (50.0, 100.0)  # comm of 185 and 92 ms: the link, not the 2-core host, dominates
UPDATES, WARMUP = 15, 3
HEADERS = 1514 / 1448  # bytes on the link per payload byte: a full TCP segment at MTU 1500
OTHER_TRAFFIC = 0.10  # Dask's messages, scalar all-reduces: 2-3 % of the gradients, measured


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


def ring_bytes(n_params: int, n_ranks: int) -> float:
    """Bytes the cost model has each rank send per all-reduce: its comm seconds on a link
    without latency, times the link's bytes per second (``2 (P − 1) M / P`` for the ring)."""
    network = Network("bytes", bandwidth_gbps=1.0, latency_us=0.0)
    cost = CostModel(network, n_params=n_params, compute_per_example=0.0)
    return cost.comm_seconds(n_ranks) * network.bytes_per_second


def sent_bytes(host: netns.Host) -> int:
    """Bytes ``host`` sent through its uplink since the link was (re)shaped: its tbf qdisc's
    counter, which charges every segment its 66 bytes of headers."""
    out = subprocess.run(host.exec_argv(["tc", "-s", "qdisc", "show", "dev", host.ifname,
                                         "root"]), capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"Sent (\d+) bytes", out)
    assert found, out
    return int(found.group(1))


def train_on(net, client, cfg, data, *, rate: float, delay_ms: float) -> tuple[list, list]:
    """Train on ``net`` reshaped to ``rate``: (update records, bytes each host sent)."""
    net = netns.reshape(net, rate_mbit=rate, delay_ms=delay_ms)
    state = train(cfg, data, cluster=client)
    return ([r for r in state.history if r["kind"] == "update"],
            [sent_bytes(h) for h in net.hosts])


@pytest.mark.slow
def test_decentralized_training_sends_the_models_bytes_on_shaped_links(tmp_path):
    """Every update's all-reduce crosses the shaped links and carries the bytes the cost model
    charges for it: each host sends at least UPDATES ring all-reduces of the gradients, and
    the host that ships no results to the driver little more (headers, Dask's messages).
    The comm times are printed (with -s) for reading; bench/network_model.py benchmarks them."""
    require_namespaces()
    delay_ms = 1.0 if netns.netem_available()[0] else 0.0
    rng = np.random.default_rng(0)
    data = TrainData.from_arrays(rng.normal(size=(2048, 40)).astype("float32"),
                                 rng.integers(0, 10, size=2048))
    cfg = config(2)
    n_params = sum(p.numel() for p in build_model(cfg).parameters())
    gradients = UPDATES * ring_bytes(n_params, 2)  # what each rank sends, payload only
    with netns.shaped_network(2, rate_mbit=RATES_MBIT[0], delay_ms=delay_ms,
                              prefix="dtlinks") as net, \
            netns.dask_on_network(net, workdir=tmp_path) as address, \
            Client(address, set_as_default=False) as client:
        for rate in RATES_MBIT:
            updates, sent = train_on(net, client, cfg, data, rate=rate, delay_ms=delay_ms)
            assert len(updates) == UPDATES
            assert {r["n_workers"] for r in updates} == {2}
            ratios = [b / gradients for b in sent]
            assert min(ratios) >= 1.0, (rate, ratios)  # every update's gradients went out
            assert min(ratios) <= HEADERS * (1 + OTHER_TRAFFIC), (rate, ratios)
            comm = statistics.median(r["time_comm"] for r in updates[WARMUP:])
            print(f"{rate:g} Mbit/s: sent {ratios[0]:.3f}, {ratios[1]:.3f} x the gradients; "
                  f"comm {comm * 1e3:.1f} ms (not asserted: a time)")
    assert leftovers("dtlinks") == []
