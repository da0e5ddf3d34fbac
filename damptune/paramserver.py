"""The parameter server over ``torch.distributed`` (``centralized`` mode).

Rank 0 is the master: it alone holds the optimizer state that counts and applies the update.
Per update, the training ranks send their gradient sums (with the loss sum and rank 0's
flag) to the master (a gather, summed there in rank order; gloo's reduce for large models),
the master steps, and broadcasts its new weights together with the loss, the gradient norm
and the flag, so every rank plans the next update exactly as the master does. Two
collectives per update, no Dask round trip; P may change at any update (:mod:`damptune.ranks`).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.utils import vector_to_parameters

from damptune.loop import FLAG_NONE, optimizer_step
from damptune.ranks import RankOps

__all__ = ["ServerOps"]


class ServerOps(RankOps):
    """Gradients reduced to the master (rank 0), which steps and broadcasts the weights."""

    def gradient(self, shares: list[np.ndarray]) -> tuple[float, float, float, int]:
        loss, t_compute, flag = self._forward(shares)
        if self.procs == 1:
            return loss, t_compute, 0.0, flag
        t1 = time.perf_counter()
        total = self._sum_to_root(self._flat(loss, flag))  # every gradient to the master
        # the others learn the loss and the flag from the master's broadcast in step()
        loss_total, flag_sum = self._unflat(total) if total is not None else (0.0, FLAG_NONE)
        return loss_total, t_compute, time.perf_counter() - t1, flag_sum

    def step(self, optimizer: torch.optim.Optimizer, *, lr: float, batch_size: int,
             loss_sum: float, flag: int) -> tuple[float, float, int, float]:
        """The master steps; every training rank gets its weights, loss sum, gradient norm
        and flag (exact: the three numbers travel as float64 bits)."""
        if self.procs == 1:
            return super().step(optimizer, lr=lr, batch_size=batch_size, loss_sum=loss_sum,
                                flag=flag)
        t0 = time.perf_counter()
        params = list(self.model.parameters())
        n = sum(p.numel() for p in params)
        dtype, device = params[0].dtype, params[0].device
        if self.rank == 0:
            grad_sq = optimizer_step(optimizer, lr=lr, batch_size=batch_size)
            tail = torch.tensor([loss_sum, grad_sq, float(flag)], dtype=torch.float64,
                                device=device).view(dtype)
            flat = torch.cat([p.detach().reshape(-1) for p in params] + [tail])
        else:
            flat = torch.empty(n + 3 * 8 // dtype.itemsize, dtype=dtype, device=device)
        dist.broadcast(flat, src=0, group=self.group)
        if self.rank != 0:
            with torch.no_grad():
                vector_to_parameters(flat[:n], params)
        loss_sum, grad_sq, flag_value = flat[n:].clone().view(torch.float64).tolist()
        return loss_sum, grad_sq, int(round(flag_value)), time.perf_counter() - t0
