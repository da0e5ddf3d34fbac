"""Centralized (parameter-server) data parallelism through Dask.

The driver holds the model and the optimizer. Each update it sends the weights to P ranks,
each rank returns the gradient sum over its share of the global batch, and the driver adds them
up in rank order and steps. P may change at any update.

A rank is a Dask *actor* on a worker: it keeps the model and the data (which travels to the
worker once), and calls go from the driver straight to the worker, without a trip through the
scheduler (`bench/step_time.py` measures what a step costs). If a rank's
worker is lost, the share is recomputed by a new rank on another worker.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import CancelledError
from typing import Any

import numpy as np
import torch
from distributed import Client
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from damptune.cluster import WorkerGroup, gather_within, scatter_data
from damptune.config import TrainConfig
from damptune.errors import ClusterError
from damptune.loop import FLAG_NONE, LocalOps, shard_forward
from damptune.state import TrainData, build_model, resolve_device

__all__ = ["CentralizedOps", "Rank"]

MAX_ATTEMPTS = 4  # tries of one update's shares when workers are lost
log = logging.getLogger("damptune.centralized")


def _is_comm(exc: BaseException) -> bool:
    """Errors that mean the rank's worker is gone (not a bug in the computation)."""
    from distributed.comm.core import CommClosedError

    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    return isinstance(exc, CommClosedError | OSError | EOFError) or bool(
        names & {"CommClosedError", "KilledWorker", "FutureCancelledError", "CancelledError"}
    ) or "Worker holding Actor was lost" in str(exc)


class Rank:
    """A parameter-server rank living on a Dask worker (used as an actor)."""

    def __init__(self, config: TrainConfig, data: TrainData) -> None:
        torch.set_num_threads(1)  # one rank per single-threaded worker
        device = resolve_device(config)
        self.data = data.to(device)
        self.model = build_model(config).to(device)

    def _load(self, weights: np.ndarray) -> None:
        with torch.no_grad():
            device = next(self.model.parameters()).device
            vector_to_parameters(torch.from_numpy(weights).to(device), self.model.parameters())

    def gradient(self, weights: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, float, float]:
        """(gradient sum over ``idx``, loss sum, seconds) at ``weights``."""
        t0 = time.perf_counter()
        self._load(weights)
        loss = shard_forward(self.model, self.data.X, self.data.y, idx, grad=True)
        grad = parameters_to_vector([p.grad for p in self.model.parameters()])  # type: ignore[misc]
        return grad.detach().cpu().numpy(), loss, time.perf_counter() - t0

    def loss(self, weights: np.ndarray, idx: np.ndarray) -> float:
        self._load(weights)
        return shard_forward(self.model, self.data.X, self.data.y, idx, grad=False)


class CentralizedOps:
    """Gradients on Dask actors, optimizer on the driver (see module docstring)."""

    world_size = None

    def __init__(
        self,
        *,
        client: Client,
        model: torch.nn.Module,
        config: TrainConfig,
        data: TrainData,
        data_future: Any,
        group: WorkerGroup,
    ) -> None:
        if not group.addresses:
            raise ClusterError("the Dask cluster has no workers; start at least one")
        self.client, self.model, self.config, self.data = client, model, config, data
        self.data_future, self.group = data_future, group
        self.ranks: dict[str, Any] = {}  # worker address -> Rank actor
        self.local = LocalOps(model, data)

    @property
    def workers(self) -> list[str]:
        return self.group.addresses

    def _rank(self, r: int) -> Any:
        worker = self.workers[r % len(self.workers)]
        for attempt in range(2):
            if worker in self.ranks:
                break
            future = self.client.submit(
                Rank, self.config, self.data_future, workers=[worker], actor=True, pure=False,
                allow_other_workers=False,
            )
            try:
                with self.client.as_current():  # the actor handle binds to the current client
                    (self.ranks[worker],) = gather_within([future], timeout=self.config.timeout,
                                                          what=f"starting rank {r} on {worker}")
            except CancelledError:  # "lost dependencies": the data went with a dead worker
                if attempt:
                    raise
                self.data_future = scatter_data(self.client, self.data, again=True)
        return self.ranks[worker]

    def _call(self, method: str, shares: list[np.ndarray]) -> list[Any]:
        """Each share on its rank; a share whose worker is lost is computed again on a new
        rank on a live worker (same weights, same share, so the same result)."""
        weights = parameters_to_vector(self.model.parameters()).detach().cpu().numpy()
        results: list[Any] = [None] * len(shares)
        pending = list(range(len(shares)))
        for attempt in range(MAX_ATTEMPTS):
            futures, lost = {}, []
            for r in pending:
                try:
                    futures[r] = getattr(self._rank(r), method)(weights, shares[r])
                except RuntimeError as exc:  # the actor's worker was lost before the call
                    if not _is_comm(exc):
                        raise
                    lost.append(r)
            deadline = time.monotonic() + self.config.timeout
            for r, future in futures.items():
                try:
                    results[r] = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except TimeoutError as exc:
                    raise ClusterError(f"rank {r} did not answer within timeout="
                                       f"{self.config.timeout} s") from exc
                except (TypeError, ValueError, RuntimeError) as exc:
                    if not _is_comm(exc):
                        raise
                    lost.append(r)
                except Exception as exc:  # noqa: BLE001 - connection errors of a dead worker
                    if not _is_comm(exc):
                        raise
                    lost.append(r)
            if not lost:
                return results
            self._replace(lost, attempt)
            pending = lost
        raise ClusterError(f"ranks {pending} kept failing after {MAX_ATTEMPTS} attempts")

    def _replace(self, lost: list[int], attempt: int) -> None:
        dead = {self.workers[r % len(self.workers)] for r in lost}
        log.warning("lost worker(s) %s; recomputing their shares elsewhere", sorted(dead))
        for worker in dead:
            self.ranks.pop(worker, None)
        before = set(self.workers)
        self.group.replace(dead, need=1, timeout=self.config.timeout)  # shares go round-robin
        if not before & set(self.workers):  # the whole group was lost: maybe the data too
            self.ranks.clear()
            self.data_future = scatter_data(self.client, self.data)
        time.sleep(0.2 * attempt)

    def gradient(self, shares: list[np.ndarray]) -> tuple[float, float, float, int]:
        t0 = time.perf_counter()
        results = self._call("gradient", shares)
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
        return loss, t_compute, time.perf_counter() - t0 - t_compute, FLAG_NONE

    def loss(self, shares: list[np.ndarray]) -> float:
        total = 0.0
        for value in self._call("loss", shares):
            total += value
        return total

    def evaluate(self, n_ranks: int) -> tuple[float, int, int]:
        return self.local.evaluate(n_ranks)  # the driver holds the model

    def close(self) -> None:
        self.ranks.clear()  # releasing the actor futures lets Dask drop the ranks
