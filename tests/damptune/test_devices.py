"""Which device each rank gets and which backend its group uses (damptune.devices): the pure
rules for given worker reports, and the engine applying them on a real (CPU) cluster."""

import pytest
import torch
from distributed import Client

from damptune import ConfigError, TrainConfig, TrainData, train
from damptune.devices import (
    Placement,
    WorkerReport,
    choose_backend,
    local_ranks,
    parse_device,
    place_ranks,
    this_process_device,
    unpinned_gpu_hosts,
    worker_report,
)

from .test_modes import config


def report(host, gpus, visible=None, port=1):
    return WorkerReport(f"tcp://{host}:{port}", host, visible, gpus)


def workers(*spec):
    """``("a", 2), ("b", 2)`` → reports of workers on those hosts with that many GPUs."""
    return [report(host, gpus, *rest, port=i) for i, (host, gpus, *rest) in enumerate(spec)]


# -- the placement rules ------------------------------------------------------------------------
def test_local_rank_is_the_index_among_the_groups_ranks_on_the_same_host():
    assert local_ranks(["a", "b", "a", "b", "c", "a"]) == [0, 0, 1, 1, 0, 2]


def test_ranks_on_two_hosts_take_their_hosts_gpus_in_turn():
    """Ranks alternate between two hosts of 2 GPUs each: rank r's GPU is its index on its
    host, so ranks 0 and 2 (host a) are on cuda:0 and cuda:1; ``r % device_count`` would put
    both on cuda:0."""
    plan = place_ranks("cuda", workers(("a", 2), ("b", 2), ("a", 2), ("b", 2)))
    assert plan == Placement(("cuda:0", "cuda:0", "cuda:1", "cuda:1"), "nccl")


def test_auto_is_cuda_when_every_worker_has_a_gpu():
    assert place_ranks("auto", workers(("a", 4), ("a", 4), ("a", 4))).devices == (
        "cuda:0", "cuda:1", "cuda:2")


def test_a_worker_with_its_own_cuda_visible_devices_uses_its_cuda_0():
    """dask-cuda's LocalCUDACluster gives worker i the list rotated to start at GPU i: each
    sees its GPU as cuda:0, and the ranks are on distinct GPUs: NCCL."""
    plan = place_ranks("auto", workers(("a", 2, "0,1"), ("a", 2, "1,0")))
    assert plan == Placement(("cuda:0", "cuda:0"), "nccl")


def test_two_workers_pinned_to_one_gpu_share_it_only_when_asked():
    pinned = workers(("a", 1, "3"), ("a", 1, "3"))
    with pytest.raises(ConfigError, match=r"share_gpus=False.*GPU 3 of host a"):
        place_ranks("cuda", pinned)
    plan = place_ranks("cuda", pinned, share_gpus=True)
    assert plan.devices == ("cuda:0", "cuda:0") and plan.backend == "gloo"


def test_ranks_sharing_one_gpu_need_share_gpus_and_then_use_gloo_with_the_reason():
    one_gpu = workers(("a", 1), ("a", 1), ("a", 1), ("a", 1))
    with pytest.raises(ConfigError, match=r"share_gpus=False.*ranks \[0, 1, 2, 3\] on GPU 0"):
        place_ranks("auto", one_gpu)
    plan = place_ranks("auto", one_gpu, share_gpus=True)
    assert plan.devices == ("cuda:0",) * 4 and plan.backend == "gloo"
    assert plan.note == "4 ranks on 1 GPU: NCCL needs one GPU per rank; using gloo"
    with pytest.raises(ConfigError, match=r"backend='nccl'.*one GPU per rank"):
        place_ranks("auto", one_gpu, share_gpus=True, backend="nccl")


def test_more_ranks_than_gpus_on_a_host_share_only_the_extra_ones():
    plan = place_ranks("cuda", workers(("a", 2), ("a", 2), ("a", 2)), share_gpus=True)
    assert plan.devices == ("cuda:0", "cuda:1", "cuda:0") and plan.backend == "gloo"
    assert plan.note.startswith("3 ranks on 2 GPUs")


def test_sharing_is_never_implicit_even_if_asked_devices_differ_by_host():
    """The same cuda index on two hosts is two GPUs: no sharing, NCCL."""
    assert place_ranks("cuda:1", workers(("a", 2), ("b", 2))) == Placement(
        ("cuda:1", "cuda:1"), "nccl")
    with pytest.raises(ConfigError, match=r"share_gpus"):
        place_ranks("cuda:1", workers(("a", 2), ("a", 2)))
    with pytest.raises(ConfigError, match=r"device='cuda:2'.*sees 2 CUDA device"):
        place_ranks("cuda:2", workers(("a", 2)))


def test_cuda_on_a_worker_without_gpu_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"device='cuda'.*tcp://b:1 \(host b\).*no CUDA"):
        place_ranks("cuda", workers(("a", 1), ("b", 0)))


def test_auto_without_gpus_is_cpu_and_gloo_and_says_so_when_some_workers_have_one():
    assert place_ranks("auto", workers(("a", 0), ("b", 0))) == Placement(("cpu", "cpu"),
                                                                          "gloo")
    mixed = place_ranks("auto", workers(("a", 1), ("b", 0)))
    assert mixed.devices == ("cpu", "cpu") and mixed.backend == "gloo"
    assert "tcp://b:1" in mixed.note and "CPU" in mixed.note


def test_cpu_is_gloo_and_nccl_is_refused_there():
    assert place_ranks("cpu", workers(("a", 2), ("a", 2))) == Placement(("cpu", "cpu"), "gloo")
    with pytest.raises(ConfigError, match=r"backend='nccl'"):
        place_ranks("cpu", workers(("a", 2)), backend="nccl")
    assert place_ranks("cuda", workers(("a", 2), ("a", 2)), backend="gloo").backend == "gloo"


def test_backend_choice_nccl_only_with_a_gpu_per_rank():
    assert choose_backend(["cuda:0", "cuda:1"]) == ("nccl", "")
    assert choose_backend(["cuda:0"]) == ("nccl", "")
    assert choose_backend(["cpu", "cpu"]) == ("gloo", "")
    assert choose_backend(["cuda:0", "cuda:0"]) == (
        "gloo", "2 ranks on 1 GPU: NCCL needs one GPU per rank; using gloo")
    # same name, two hosts: two GPUs
    assert choose_backend(["cuda:0", "cuda:0"], gpus=[("a", "0"), ("b", "0")]) == ("nccl", "")


@pytest.mark.parametrize("bad", ["tpu", "cuda:", "cuda:x", "CUDA", 0, None])
def test_unknown_devices_are_refused_naming_device(bad):
    with pytest.raises(ConfigError, match=r"device=.*'cpu', 'cuda', 'cuda:N' or 'auto'"):
        parse_device(bad)


def test_this_process_device():
    assert this_process_device("auto", device_count=0) == torch.device("cpu")
    assert this_process_device("auto", device_count=2) == torch.device("cuda", 0)
    assert this_process_device("cuda:1", device_count=2) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"device='cuda'.*sees 0 CUDA"):
        this_process_device("cuda", device_count=0)
    with pytest.raises(ConfigError, match=r"device='cuda:2'.*sees 2 CUDA"):
        this_process_device("cuda:2", device_count=2)


def test_hosts_whose_gpu_workers_are_not_pinned_are_found():
    assert unpinned_gpu_hosts(workers(("a", 2), ("a", 2), ("b", 2, "0"), ("b", 2, "1"),
                                      ("c", 0), ("c", 0))) == ["a"]


def test_worker_report_reads_the_workers_environment(monkeypatch):
    class FakeWorker:
        address = "tcp://10.0.0.5:4000"

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    got = worker_report(FakeWorker())
    assert (got.address, got.visible, got.device_count) == ("tcp://10.0.0.5:4000", "2,3",
                                                            torch.cuda.device_count())
    assert got.visible_ids == ["2", "3"]


@pytest.mark.parametrize(("kw", "match"), [
    ({"backend": "nccl"}, r"backend='nccl'.*device='cpu'"),
    ({"backend": "mpi"}, r"backend='mpi'"),
    ({"share_gpus": "yes"}, r"share_gpus='yes'"),
    ({"micro_batch": 0}, r"micro_batch=0"),
    ({"device": "gpu:0"}, r"device='gpu:0'"),
])
def test_config_refuses_bad_device_settings(kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**{**config("local", 1).to_dict(), **kw}).validate()


# -- the engine applies the placement on its ranks ----------------------------------------------
def _rank_placement():
    """On a worker: (rank, parameters' device, data's device, backend, micro-batch) of each
    rank this process holds."""
    import torch.distributed as dist

    from damptune import worker

    out = []
    for reg in list(worker._REGISTRY.values()):
        ops, state = reg.get("ops"), reg.get("state")
        if ops is not None and state is not None:
            out.append((ops.rank, str(next(state.model.parameters()).device),
                        str(ops.data.X.device), dist.get_backend() if dist.is_initialized()
                        else None, ops.micro_batch))
    return out


class RankProbe:
    """A ``train`` callback: at the first record (the ranks are formed and idle between
    segments) it asks every worker where its rank's tensors are and which backend it uses."""

    def __init__(self, scheduler):
        self.client = Client(scheduler, timeout="10s", set_as_default=False)
        self.ranks = None

    def __call__(self, record):
        if self.ranks is None:
            found = self.client.run(_rank_placement)
            self.ranks = sorted(r for v in found.values() for r in v)

    def close(self):
        self.client.close()


@pytest.fixture
def probe(scheduler):
    p = RankProbe(scheduler)
    yield p
    p.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is CUDA here: see test_gpu.py")
@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_auto_on_cpu_workers_trains_every_rank_on_cpu_with_gloo(blobs, scheduler, probe, mode):
    X, y, Xt, yt = blobs
    train(config(mode, 2, device="auto", max_epochs=1, micro_batch=4), TrainData.from_arrays(
        X, y, Xt, yt), cluster=scheduler, callback=probe)
    assert probe.ranks == [(0, "cpu", "cpu", "gloo", 4), (1, "cpu", "cpu", "gloo", 4)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("given", [True, False], ids=["placement", "calibration"])
def test_cuda_without_gpus_fails_before_training_naming_device(blobs, scheduler, given):
    """Where the workers have no GPU: refused by the placement (or by the calibration on a
    worker, when compute is measured), not by a torch error inside a rank."""
    X, y, Xt, yt = blobs
    extra = {"compute_per_example": 1e-4, "compute_fixed": 0.0} if given else {}
    seen = []
    with pytest.raises(ConfigError, match=r"device='cuda'.*no CUDA device"):
        train(config("decentralized", 2, device="cuda", **extra),
              TrainData.from_arrays(X, y, Xt, yt), cluster=scheduler, callback=seen.append)
    assert seen == []
    with pytest.raises(ConfigError, match=r"device='cuda'.*sees 0 CUDA"):
        train(config("local", 1, device="cuda"), TrainData.from_arrays(X, y, Xt, yt))


def test_the_drivers_placement_reaches_the_ranks_and_its_note_the_user(blobs, scheduler, probe,
                                                                      monkeypatch):
    """The driver asks each rank's worker (one report per rank, from that worker), decides,
    warns with the decision's note, and every rank applies its device and the backend."""
    import damptune.segments as segments

    asked = []

    def decide(device, reports, **kw):
        asked.append([r.address for r in reports])
        return Placement(("cpu", "cpu"), "gloo", "2 ranks on 1 GPU: NCCL needs one GPU per "
                         "rank; using gloo")

    monkeypatch.setattr(segments, "place_ranks", decide)
    X, y, Xt, yt = blobs
    with pytest.warns(UserWarning, match="2 ranks on 1 GPU: NCCL needs one GPU per rank"):
        train(config("decentralized", 2, device="auto", max_epochs=1, compute_per_example=1e-4,
                     compute_fixed=0.0), TrainData.from_arrays(X, y, Xt, yt), cluster=scheduler,
              callback=probe)
    with Client(scheduler, timeout="10s", set_as_default=False) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    assert asked == [workers[:2]]  # once per formation, rank r's report from its worker
    assert [r[:4] for r in probe.ranks] == [(0, "cpu", "cpu", "gloo"), (1, "cpu", "cpu", "gloo")]
