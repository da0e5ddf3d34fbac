"""Runs that share a process (the cells of a grid train in threads) get the initial weights
their seed says, whoever else seeds, draws from or restores torch's default generator
meanwhile. (Found as a grid whose first trials differed from a rerun's.)"""

import threading

import torch

from damptune.state import GLOBAL_RNG_LOCK, build_model
from tests.threads import OK, run_in_threads

from .test_modes import config


def test_models_built_in_concurrent_threads_have_their_seeds_weights():
    configs = [config("local", 1, seed=seed, module_kwargs={
        "input_shape": (12,), "n_classes": 3, "hidden": 256}) for seed in (1, 2)]
    alone = [build_model(c).state_dict() for c in configs]
    errors: list[str] = []
    start = threading.Barrier(3)

    def build(i: int) -> None:
        start.wait()
        for _ in range(30):
            got = build_model(configs[i]).state_dict()
            if any(not torch.equal(got[k], alone[i][k]) for k in got):
                errors.append(f"seed {configs[i].seed}: other weights")

    def meddle() -> None:  # another run saving and restoring the generator, as a calibration
        start.wait()     # does (under the lock that damptune's own users of it hold)
        for _ in range(300):
            with GLOBAL_RNG_LOCK:
                state = torch.get_rng_state()
                torch.rand(1000)
                torch.set_rng_state(state)

    outcomes = run_in_threads([lambda: build(0), lambda: build(1), meddle])
    assert outcomes == [OK] * 3, outcomes  # every thread ended, none raised
    assert not errors, errors[:3]
