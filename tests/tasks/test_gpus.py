"""The grid's GPUs: a local cluster whose workers each get their own CUDA_VISIBLE_DEVICES, and
the device check of the cluster's workers when the session opens."""

import logging
import os
import sys

import pytest
import torch
from distributed import Client

from damptune import ConfigError
from damptune.devices import WorkerReport, place_ranks, worker_report
from tasks import gpus


def _visible():
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_local_gpu_cluster_gives_each_worker_its_own_gpu_first(tmp_path, monkeypatch):
    """Without dask-cuda: one nanny per GPU, started with CUDA_VISIBLE_DEVICES rotated to its
    own GPU (what dask-cuda does), so each worker's cuda:0 is a different GPU. The ids are
    this test's (no GPU is needed to check what the workers are given)."""
    monkeypatch.setitem(sys.modules, "dask_cuda", None)  # not importable
    monkeypatch.setattr(gpus, "gpu_ids", lambda: ["0", "1", "2"])
    cluster = gpus.local_cluster_for("cuda", n_workers=2, local_directory=str(tmp_path))
    try:
        with Client(cluster, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
            seen = sorted(client.run(_visible).values())
            reports = list(client.run(worker_report).values())
    finally:
        cluster.close()
    assert seen == ["0,1", "1,0"]
    assert sorted(r.visible_ids[0] for r in reports) == ["0", "1"]
    if all(r.device_count for r in reports):  # on GPUs: a GPU each, NCCL
        assert place_ranks("cuda", reports).backend == "nccl"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_local_cluster_with_cuda_on_a_machine_without_gpus_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"device='cuda'.*sees no CUDA device"):
        gpus.local_cluster_for("cuda", n_workers=2, local_directory=str(tmp_path))


def test_local_cluster_with_fewer_gpus_than_ranks_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "gpu_ids", lambda: ["0"])
    with pytest.raises(ConfigError, match=r"networks=4.*at most 1 ranks.*this machine has 1"):
        gpus.local_cluster_for("auto", n_workers=4, local_directory=str(tmp_path))


class FakeClient:
    """``client.run(worker_report)`` answered with given reports."""

    def __init__(self, reports):
        self.reports = reports

    def run(self, fn):
        return {r.address: r for r in self.reports}


def test_check_refuses_ranks_that_would_share_a_gpu_naming_device(caplog):
    one_gpu = [WorkerReport(f"tcp://a:{i}", "a", None, 1) for i in range(2)]
    with pytest.raises(ConfigError, match=r"device='auto'.*a GPU of its own.*ranks \[0, 1\] "
                       r"on GPU 0 of host a"):
        gpus.check_workers(FakeClient(one_gpu), device="auto", n_workers=2)
    two_gpus = [WorkerReport(f"tcp://a:{i}", "a", None, 2) for i in range(2)]
    with caplog.at_level(logging.INFO, logger="damptune.tasks"):
        plan = gpus.check_workers(FakeClient(two_gpus), device="cuda", n_workers=2)
    assert plan.devices == ("cuda:0", "cuda:1") and plan.backend == "nccl"
    assert "may use the same GPUs" in caplog.text  # unpinned workers: concurrent trials


def test_check_of_the_real_cluster_without_gpus(scheduler):
    with Client(scheduler, timeout="10s", set_as_default=False) as client:
        assert gpus.check_workers(client, device="cpu", n_workers=4) is None
        if torch.cuda.is_available():
            return
        assert gpus.check_workers(client, device="auto", n_workers=4).devices == ("cpu",) * 4
        with pytest.raises(ConfigError, match=r"device='cuda'.*no CUDA device"):
            gpus.check_workers(client, device="cuda", n_workers=2)
