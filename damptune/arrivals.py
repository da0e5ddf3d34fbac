"""Which gradients enter an update, computed on which weights, and what it waited for: the
profile's straggler draws (:mod:`damptune.stragglers`) under the config's ``sync``
(:mod:`damptune.tolerance`), in the update math of every mode.

Every rank computes the same answer (the draws depend on the seed and the update only, the
``ssp`` clocks and weight versions are the run's state), so the ranks' collectives agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from damptune.netmodel import CostModel, get_profile
from damptune.state import TrainState
from damptune.tolerance import arrival, parse_sync

if TYPE_CHECKING:  # the loop imports this module
    from damptune.loop import Ops

__all__ = ["Arrived", "arrived", "gradient", "keep_version"]


@dataclass(frozen=True)
class Arrived:
    """The shares whose gradients enter the update (a dropped one left empty: its rank adds
    nothing), the straggler factor of its compute, and each rank's staleness (``ssp``; ()
    when every gradient is computed on the newest weights)."""

    shares: list[np.ndarray]
    straggle: float = 1.0
    staleness: tuple[int, ...] = ()


def arrived(state: TrainState, shares: list[np.ndarray], cost: CostModel,
            batch_size: int) -> Arrived:
    """What this update of ``len(shares)`` ranks uses (module docstring)."""
    cfg = state.config
    stragglers = get_profile(cfg.profile).stragglers
    tolerance = parse_sync(cfg.sync)
    if stragglers is None and tolerance.backup == 0:
        return Arrived(shares)  # every rank at the same pace: nothing waits, nothing is stale
    factors = (stragglers.factors(cfg.seed, state.update, len(shares)) if stragglers
               else np.ones(len(shares)))
    if tolerance.kind == "ssp" and tolerance.staleness > 0:
        compute = cost.compute_seconds(batch_size, len(shares))
        seconds, staleness = state.ssp_clock.step(factors, compute, tolerance.staleness)
        straggle = seconds / compute if compute > 0 else 1.0
        return Arrived(shares, straggle, tuple(staleness) if any(staleness) else ())
    got = arrival(tolerance, factors)
    if got.kept.all() or not any(len(s) for s, k in zip(shares, got.kept, strict=True) if k):
        return Arrived(shares, got.straggle)  # (every kept share empty: a batch below P)
    return Arrived([s if kept else s[:0] for s, kept in zip(shares, got.kept, strict=True)],
                   got.straggle)


def gradient(state: TrainState, ops: Ops, got: Arrived) -> tuple[float, float, float, int]:
    """The update's gradient sum into ``.grad`` (``Ops.gradient``'s answer): at once when
    every gradient is fresh; else one pass per staleness, each rank's shares on the weights
    of that many updates before the newest (:func:`keep_version`: the newest is the last
    kept), then the newest back."""
    if not got.staleness:
        return ops.gradient(got.shares)
    params = list(state.model.parameters())
    newest = parameters_to_vector(params).detach().clone()
    total, loss_sum, t_compute, t_comm, flag = None, 0.0, 0.0, 0.0, 0
    for age in sorted(set(got.staleness)):
        part = [s if a == age else s[:0] for s, a in zip(got.shares, got.staleness, strict=True)]
        with torch.no_grad():
            vector_to_parameters(state.weight_versions[-1 - age], params)
        loss, seconds, comm, part_flag = ops.gradient(part)
        grads = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        total = grads.clone() if total is None else total + grads
        loss_sum, t_compute, t_comm = loss_sum + loss, t_compute + seconds, t_comm + comm
        flag = max(flag, part_flag)
    with torch.no_grad():
        vector_to_parameters(newest, params)
        offset = 0
        for p in params:
            p.grad.copy_(total[offset: offset + p.numel()].view_as(p))  # type: ignore
            offset += p.numel()
    return loss_sum, t_compute, t_comm, flag


def keep_version(state: TrainState) -> None:
    """Before an update under ``ssp:S`` on a profile with stragglers (else no gradient is ever
    stale), keep the weights it starts from among the last ``S + 1`` versions (the newest
    last): its gradients, and those of the next ``S`` updates, may be computed on them."""
    tolerance = parse_sync(state.config.sync)
    if (tolerance.kind != "ssp" or tolerance.staleness == 0
            or get_profile(state.config.profile).stragglers is None):
        return
    newest = parameters_to_vector(state.model.parameters()).detach().clone()
    state.weight_versions = (state.weight_versions + [newest])[-(tolerance.staleness + 1):]
