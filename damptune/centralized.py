"""Centralized (parameter-server) data parallelism through Dask futures.

The driver holds the model and the optimizer. Each update it sends the weights to P ranks
(Dask tasks placed on workers), each rank returns the gradient sum over its share of the global
batch, and the driver adds them up in rank order and steps. P may change at any update; a task
whose worker is lost is rescheduled by Dask on another worker.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import torch
from distributed import Client
from torch.nn.utils import parameters_to_vector

from damptune.cluster import gather_within
from damptune.config import TrainConfig
from damptune.errors import ClusterError
from damptune.loop import shard_forward
from damptune.state import TrainData
from damptune.worker import forget, local_data, local_model

__all__ = ["CentralizedOps"]


def rank_gradient(
    run_key: str, config: TrainConfig, data: TrainData, weights: np.ndarray, idx: np.ndarray
) -> tuple[np.ndarray, float, float]:
    """On a worker: load ``weights``, return (gradient sum over ``idx``, loss sum, seconds)."""
    t0 = time.perf_counter()
    d = local_data(run_key, data, config)
    model = local_model(run_key, config)
    with torch.no_grad():
        flat = torch.from_numpy(weights).to(next(model.parameters()).device)
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
    loss = shard_forward(model, d.X, d.y, idx, grad=True)
    grad = parameters_to_vector([p.grad for p in model.parameters()])  # type: ignore[misc]
    return grad.detach().cpu().numpy(), loss, time.perf_counter() - t0


def rank_loss(
    run_key: str, config: TrainConfig, data: TrainData, weights: np.ndarray, idx: np.ndarray
) -> float:
    d = local_data(run_key, data, config)
    model = local_model(run_key, config)
    with torch.no_grad():
        flat = torch.from_numpy(weights).to(next(model.parameters()).device)
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
    return shard_forward(model, d.X, d.y, idx, grad=False)


class CentralizedOps:
    """Gradients on Dask workers, optimizer on the driver (see module docstring)."""

    world_size = None

    def __init__(
        self,
        *,
        client: Client,
        model: torch.nn.Module,
        config: TrainConfig,
        data: TrainData,
        data_future: Any,
        workers: list[str],
    ) -> None:
        if not workers:
            raise ClusterError("the Dask cluster has no workers; start at least one")
        self.client, self.model, self.config, self.data = client, model, config, data
        self.data_future, self.workers = data_future, workers
        self.run_key = f"central-{uuid.uuid4().hex[:12]}"

    def _weights(self) -> np.ndarray:
        return parameters_to_vector(self.model.parameters()).detach().cpu().numpy()

    def _run(self, fn: Any, shares: list[np.ndarray]) -> list[Any]:
        weights = self._weights()
        futures = [
            self.client.submit(
                fn, self.run_key, self.config, self.data_future, weights, share,
                workers=[self.workers[r % len(self.workers)]], allow_other_workers=True,
                pure=False,
            )
            for r, share in enumerate(shares)
        ]
        return gather_within(futures, timeout=self.config.timeout, what=fn.__name__)

    def gradient(self, shares: list[np.ndarray]) -> tuple[float, float, float, bool]:
        t0 = time.perf_counter()
        results = self._run(rank_gradient, shares)
        total = results[0][0].copy()
        for grad, _, _ in results[1:]:
            total += grad
        offset = 0
        for p in self.model.parameters():
            n = p.numel()
            chunk = torch.from_numpy(total[offset : offset + n]).view_as(p).to(p.device)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n
        loss = 0.0
        for _, rank_loss_sum, _ in results:
            loss += rank_loss_sum
        t_compute = max(r[2] for r in results)
        return loss, t_compute, time.perf_counter() - t0 - t_compute, False

    def loss(self, shares: list[np.ndarray]) -> float:
        return float(sum(self._run(rank_loss, shares)))

    def evaluate(self, n_ranks: int) -> tuple[float, int, int]:
        from damptune.loop import LocalOps  # the driver holds the model: evaluate here

        return LocalOps(self.model, self.data).evaluate(n_ranks)

    def close(self) -> None:
        try:
            self.client.run(forget, self.run_key)
        except Exception:  # noqa: BLE001 - cleanup of a cache on a possibly dead cluster
            pass
