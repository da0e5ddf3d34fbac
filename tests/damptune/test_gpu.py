"""The CUDA/NCCL path. Marked ``gpu``: skipped (with the reason) where no CUDA device exists.

Where the ranks train is read on the ranks' own workers while they train (``RankProbe``:
each rank's parameters and data, and its process group's backend), not inferred from the
losses, which match on any device.
"""

import numpy as np
import pytest
import torch

from damptune import ConfigError, TrainData, train
from damptune.loop import shard_forward
from models import WideResNet

from .test_devices import RankProbe
from .test_modes import config, losses

pytestmark = pytest.mark.gpu

needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2,
                               reason="NCCL needs one GPU per rank: 2 GPUs")


@pytest.fixture
def data(blobs):
    X, y, Xt, yt = blobs
    return TrainData.from_arrays(X, y, Xt, yt)


@pytest.fixture
def probe(scheduler):
    p = RankProbe(scheduler)
    yield p
    p.close()


def where(probe):
    """(rank, parameters' device, data's device, backend) of every rank."""
    return [r[:4] for r in probe.ranks]


def test_gpu_local_matches_cpu(data):
    cpu = train(config("local", 1), data)
    gpu = train(config("local", 1, device="cuda"), data)
    assert next(gpu.model.parameters()).is_cuda
    # atol: late losses of this separable problem fall to ~1e-7, where float32 rounding on the
    # two devices differs by ~1e-8 (a 2 % relative gap on an H100, torch 2.11+cu130); a real
    # divergence is orders of magnitude above it
    np.testing.assert_allclose(losses(gpu), losses(cpu), rtol=1e-3, atol=1e-6)


@needs_two
@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_gpu_ranks_train_on_a_gpu_each_with_nccl(data, scheduler, probe, mode, device):
    """Both modes (the parameter server too): rank r on its own GPU, NCCL between them."""
    ref = train(config("local", 1, device="cuda"), data)
    state = train(config(mode, 2, device=device), data, cluster=scheduler, callback=probe)
    assert where(probe) == [(0, "cuda:0", "cuda:0", "nccl"), (1, "cuda:1", "cuda:1", "nccl")]
    np.testing.assert_allclose(losses(state), losses(ref), rtol=1e-3)
    assert not next(state.model.parameters()).is_cuda  # the driver only holds the state


@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_gpu_ranks_share_a_gpu_only_when_asked_and_then_use_gloo(data, scheduler, probe,
                                                                   mode):
    """Two ranks on one GPU (a 1-GPU machine, or ``cuda:0`` on any): refused without
    share_gpus; with it, both train on cuda:0 over gloo, and the warning says why."""
    device = "cuda" if torch.cuda.device_count() == 1 else "cuda:0"
    with pytest.raises(ConfigError, match=r"share_gpus=False.*ranks \[0, 1\] on GPU 0"):
        train(config(mode, 2, device=device), data, cluster=scheduler)
    with pytest.warns(UserWarning, match="2 ranks on 1 GPU: NCCL needs one GPU per rank; "
                      "using gloo"):
        state = train(config(mode, 2, device=device, share_gpus=True), data,
                      cluster=scheduler, callback=probe)
    assert where(probe) == [(0, "cuda:0", "cuda:0", "gloo"), (1, "cuda:0", "cuda:0", "gloo")]
    ref = train(config("local", 1, device="cuda"), data)
    np.testing.assert_allclose(losses(state), losses(ref), rtol=1e-3)


def test_gpu_micro_batches_bound_the_memory_of_a_large_share():
    """Wide-ResNet-16-4, a share of 256 CIFAR-sized examples: in micro-batches of 64 the
    peak memory is well under that of one pass of 256 (activations of 64, not 256)."""
    torch.manual_seed(0)
    model = WideResNet(input_shape=(3, 32, 32), n_classes=10).cuda()
    X = torch.randn(256, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    peaks = {}
    for micro in (None, 64):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        shard_forward(model, X, y, np.arange(256), grad=True, micro_batch=micro)
        torch.cuda.synchronize()
        peaks[micro] = torch.cuda.max_memory_allocated() - base
    assert peaks[64] < 0.5 * peaks[None], peaks
