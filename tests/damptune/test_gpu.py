"""The CUDA/NCCL path. Marked ``gpu``: skipped (with the reason) where no CUDA device exists."""

import numpy as np
import pytest
import torch

from damptune import TrainData, train

from .test_modes import config, losses

pytestmark = pytest.mark.gpu


def test_gpu_local_matches_cpu(blobs):
    X, y, Xt, yt = blobs
    data = TrainData.from_arrays(X, y, Xt, yt)
    cpu = train(config("local", 1), data)
    gpu = train(config("local", 1, device="cuda"), data)
    assert next(gpu.model.parameters()).is_cuda
    np.testing.assert_allclose(losses(gpu), losses(cpu), rtol=1e-3)


def test_gpu_centralized_ranks_use_cuda(blobs, scheduler):
    X, y, Xt, yt = blobs
    data = TrainData.from_arrays(X, y, Xt, yt)
    ref = train(config("local", 1, device="cuda"), data)
    state = train(config("centralized", 2, device="cuda"), data, cluster=scheduler)
    np.testing.assert_allclose(losses(state), losses(ref), rtol=1e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank")
def test_gpu_decentralized_nccl(blobs, scheduler):
    X, y, Xt, yt = blobs
    data = TrainData.from_arrays(X, y, Xt, yt)
    ref = train(config("local", 1, device="cuda"), data)
    state = train(config("decentralized", 2, device="auto", backend="nccl"), data,
                  cluster=scheduler)
    np.testing.assert_allclose(losses(state), losses(ref), rtol=1e-3)
