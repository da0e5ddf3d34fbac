"""A rank's share larger than ``micro_batch`` is computed in passes of at most that many
examples (bounded memory), with the same gradient; the cost model charges each pass."""

import math

import numpy as np
import pytest
import torch

from damptune import TrainData
from damptune.config import cap_for, n_workers_for
from damptune.loop import LocalOps, advance, shard_forward
from damptune.netmodel import CostModel, get_profile
from damptune.ranks import RankOps
from damptune.state import TrainState
from models import MLP

from .test_modes import config


class Passes:
    """Counts the forward passes of a module that build a graph (gradient passes, not
    evaluations) and the examples of the largest one."""

    def __init__(self, model):
        self.calls, self.largest = 0, 0
        model.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        if not torch.is_grad_enabled():
            return
        self.calls += 1
        self.largest = max(self.largest, len(inputs[0]))


def problem(n=10, seed=0):
    torch.manual_seed(seed)
    model = MLP(input_shape=(12,), n_classes=3, hidden=16)
    X = torch.randn(n, 12)
    y = torch.randint(0, 3, (n,))
    return model, X, y


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_a_share_larger_than_the_micro_batch_takes_several_passes_with_the_same_gradient():
    model, X, y = problem()
    idx = np.arange(10)
    passes = Passes(model)
    whole = shard_forward(model, X, y, idx, grad=True)
    one_pass = grads(model)
    assert (passes.calls, passes.largest) == (1, 10)
    passes.calls = passes.largest = 0
    summed = shard_forward(model, X, y, idx, grad=True, micro_batch=4)
    assert (passes.calls, passes.largest) == (3, 4)  # 4 + 4 + 2 examples
    assert summed == pytest.approx(whole, rel=1e-6)
    for a, b in zip(grads(model), one_pass, strict=True):
        torch.testing.assert_close(a, b)


def test_one_pass_when_the_share_fits_and_no_gradient_left_from_before():
    model, X, y = problem()
    passes = Passes(model)
    shard_forward(model, X, y, np.arange(10), grad=True, micro_batch=3)
    first = grads(model)
    shard_forward(model, X, y, np.arange(10), grad=True, micro_batch=3)  # zeroed first
    for a, b in zip(grads(model), first, strict=True):
        torch.testing.assert_close(a, b)
    passes.calls = 0
    shard_forward(model, X, y, np.arange(6), grad=True, micro_batch=8)
    assert passes.calls == 1


def test_local_ops_and_rank_ops_pass_the_micro_batch_on():
    model, X, y = problem(n=20)
    data = TrainData(X, y)
    passes = Passes(model)
    shares = [np.arange(0, 10), np.arange(10, 20)]
    LocalOps(model, data, micro_batch=8).gradient(shares)
    assert passes.calls == 3  # the whole batch of 20 in one process
    passes.calls = 0
    RankOps(model, data, rank=0, world=1, micro_batch=8).gradient(shares)
    assert passes.calls == 3  # one process holds both shares (procs = 1)


def test_the_update_loop_computes_a_capped_ranks_share_in_micro_batches():
    """P capped at max_workers = 1 while B grows to 32: with per_worker_batch 8 every update
    of B examples is ceil(B / 8) passes of at most 8 examples; the losses equal those of a
    run in one pass per update (same examples, same RNG, same data position)."""
    X = np.random.default_rng(0).normal(size=(96, 12)).astype("float32")
    y = (X[:, 0] > 0).astype("int64")
    data = TrainData.from_arrays(X, y, X, y)
    runs = {}
    for micro in (8, 32):
        cfg = config("local", 1, per_worker_batch=8, max_batch_size=32, max_epochs=2,
                     damper_kwargs={"initial": 8, "factor": 2, "delay": 0.5},
                     micro_batch=micro, compute_per_example=1e-3, compute_fixed=1e-2,
                     n_train=96)
        state = TrainState(cfg)
        passes = Passes(state.model)
        calls = []
        advance(state, LocalOps(state.model, data, micro_batch=cfg.micro_batch_size),
                emit=lambda r, p=passes, c=calls: c.append(p.calls) if r.kind == "update"
                else None)
        per_update = np.diff([0, *calls])
        runs[micro] = (state, per_update)
    state, per_update = runs[8]
    sizes = [r["batch_size"] for r in state.history if r["kind"] == "update"]
    assert max(sizes) == 32 and [math.ceil(b / 8) for b in sizes] == per_update.tolist()
    assert runs[32][1].tolist() == [1] * len(sizes)
    losses = [[r["loss"] for r in s.history if r["kind"] == "update"] for s, _ in runs.values()]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert state.sampler.state_dict() == runs[32][0].sampler.state_dict()
    # each pass pays the fixed cost: 8 examples per pass, 1 rank
    sim = np.diff([0.0] + [r["time_sim"] for r in state.history if r["kind"] == "update"])
    cost = state.config.cost_model(state.n_params)
    expected = [cost.update_seconds(batch_size=b, n_ranks=1) for b in sizes]
    np.testing.assert_allclose(sim, expected)
    assert cost.compute_seconds(32, 1) == pytest.approx(4 * 1e-2 + 32 * 1e-3)


def test_cost_model_charges_each_micro_batch():
    net = get_profile("decentralized-high").with_overhead(0.0, 0.0)
    one_pass = CostModel(net, 1_000, compute_per_example=1e-3, compute_fixed=0.05)
    micro = CostModel(net, 1_000, compute_per_example=1e-3, compute_fixed=0.05, micro_batch=8)
    # a share of ceil(100 / 2) = 50 examples in ceil(50 / 8) = 7 passes
    assert micro.compute_seconds(100, 2) == pytest.approx(7 * 0.05 + 50 * 1e-3)
    assert one_pass.compute_seconds(100, 2) == pytest.approx(0.05 + 50 * 1e-3)
    assert micro.compute_seconds(16, 2) == one_pass.compute_seconds(16, 2)  # 8: one pass


@pytest.mark.parametrize("network", [2, 4, 8, 16])
def test_in_the_grid_no_share_exceeds_per_worker_batch_so_its_charge_is_unchanged(network):
    """The grid caps B at network x per_worker_batch and P = ceil(B / per_worker_batch): a
    share never exceeds per_worker_batch, so the default micro-batch changes no charge."""
    pwb = 32
    cfg = config("centralized", network, min_workers=1, per_worker_batch=pwb,
                 max_batch_size=cap_for(network, pwb), compute_per_example=1e-4,
                 compute_fixed=1e-3)
    with_micro = cfg.cost_model(1_000)
    without = CostModel(with_micro.network, 1_000, 1e-4, 1e-3)
    for batch in range(1, cfg.max_batch_size + 1):
        p = n_workers_for(batch, cfg)
        assert math.ceil(batch / p) <= pwb
        assert with_micro.compute_seconds(batch, p) == without.compute_seconds(batch, p)
    # the claim fails once P is capped and B keeps growing (a cap above network x pwb)
    assert with_micro.compute_seconds(4 * cfg.max_batch_size, network) > without.compute_seconds(
        4 * cfg.max_batch_size, network)
