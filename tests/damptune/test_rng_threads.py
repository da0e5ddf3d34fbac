"""Runs that share a process (the cells of a grid train in threads) get the initial weights
their seed says, whoever else seeds, draws from or restores torch's default generator
meanwhile. (Found as a grid whose first trials differed from a rerun's.)

The interleaving that matters is forced, not hoped for: the model below stops half built
(one layer drawn from the default generator, one to draw) until another thread has tried to
seed and draw from that generator, as another run's build or calibration does."""

import threading

import torch
from torch import nn

from damptune.state import GLOBAL_RNG_LOCK, build_model
from tests.threads import OK, run_in_threads

from .test_modes import config

WAIT_S = 60.0  # a hang guard on each handshake; neither side waits for it to pass


class HalfBuilt:
    """The handshake between a model's build and the meddler (None: build straight on)."""

    halfway: threading.Event | None = None  # set by the model, between its two layers
    meddled: threading.Event | None = None  # set by the meddler once it has tried


class TwoLayers(nn.Module):
    """Two layers drawn one after the other from torch's default generator; between them,
    it waits (as :class:`HalfBuilt` says) for the meddler to try its meddling."""

    def __init__(self, n_in: int, hidden: int, n_out: int) -> None:
        super().__init__()
        self.first = nn.Linear(n_in, hidden)
        if HalfBuilt.halfway is not None and HalfBuilt.meddled is not None:
            HalfBuilt.halfway.set()
            assert HalfBuilt.meddled.wait(WAIT_S), "the meddler never tried"
        self.second = nn.Linear(hidden, n_out)


def _config(seed: int):
    return config("local", 1, seed=seed, module="tests.damptune.test_rng_threads:TwoLayers",
                  module_kwargs={"n_in": 12, "hidden": 64, "n_out": 3})


def _weights_of_seed(seed: int) -> dict[str, torch.Tensor]:
    """The weights the seed gives with nobody else about: seeded, built, in this thread."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {k: v.clone() for k, v in TwoLayers(12, 64, 3).state_dict().items()}


def test_a_model_built_while_another_thread_seeds_and_draws_has_its_seeds_weights(
        monkeypatch):
    expected = _weights_of_seed(1)
    monkeypatch.setattr(HalfBuilt, "halfway", threading.Event())
    monkeypatch.setattr(HalfBuilt, "meddled", threading.Event())
    built: list[dict[str, torch.Tensor]] = []
    tried: list[bool] = []  # the meddler's try, halfway: whether it got the generator

    def build() -> None:
        built.append(build_model(_config(1)).state_dict())

    def meddle() -> None:  # another run seeding and drawing, under the lock damptune's own
        assert HalfBuilt.halfway.wait(WAIT_S), "the build never got halfway"  # users hold
        try:
            got = GLOBAL_RNG_LOCK.acquire(blocking=False)  # the build is halfway: now
            tried.append(got)
            if got:
                try:
                    torch.manual_seed(12345)
                    torch.rand(1000)
                finally:
                    GLOBAL_RNG_LOCK.release()
        finally:
            HalfBuilt.meddled.set()
        with GLOBAL_RNG_LOCK:  # and once the build let it: a calibration's save and restore
            state = torch.get_rng_state()
            torch.manual_seed(12345)
            torch.rand(1000)
            torch.set_rng_state(state)

    outcomes = run_in_threads([build, meddle])
    assert outcomes == [OK, OK], outcomes  # both threads ended, neither raised
    assert len(tried) == 1, tried  # the meddler tried while the build was halfway
    [got] = built
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got), "other weights than seed 1's"


def test_a_build_leaves_the_default_generator_as_it_was():
    """Other runs of the process may be drawing from it: a build neither reseeds it nor
    advances it."""
    torch.manual_seed(99)
    before = torch.get_rng_state()
    build_model(_config(1))
    assert torch.equal(torch.get_rng_state(), before)
