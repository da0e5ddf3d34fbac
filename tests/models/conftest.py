"""Fixtures for the tests of the `models` package."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# `tests/models` must never shadow the `models` package: put the repository root first.
_ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("damptune-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(_session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point DAMPTUNE_CACHE at a per-session directory, never the user's ~/.cache."""
    monkeypatch.setenv("DAMPTUNE_CACHE", str(_session_cache))
    return _session_cache


@pytest.fixture
def assert_shard_sum() -> Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], None]:
    """Check that grad(batch) == grad(first half) + grad(second half) for a summed loss.

    This is what the data-parallel engine relies on: a rank's gradient on its shard, summed
    over ranks, is the gradient of the whole batch, whatever the sharding.
    """
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

    def grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        return [p.grad.detach().clone() for p in model.parameters()]

    def check(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        half = len(y) // 2
        whole = grads(model, x, y)
        first, second = grads(model, x[:half], y[:half]), grads(model, x[half:], y[half:])
        summed = [a + b for a, b in zip(first, second, strict=True)]
        assert any(g.abs().max() > 0 for g in whole)  # a zero gradient would prove nothing
        torch.testing.assert_close(summed, whole, rtol=1e-4, atol=1e-5)

    return check
