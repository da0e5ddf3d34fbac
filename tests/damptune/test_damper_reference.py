"""Every damper replayed over a recorded training trajectory, against its reference rule.

``data/trajectory.json`` (written by ``data/record_trajectory.py``): 400 updates of the default
MLP on MNIST-1D, SGD batch 32. Each damper sees it as the engine shows it (``damptune/loop.py``:
``step(Progress(update=k, loss/grad_sq_norm of update k-1, ...))`` before update ``k``, then
``observe(loss, grad_sq_norm of update k)``), and every update's damping, batch size and lr is
compared with the rule written here again, in numpy over the recorded arrays, from the AdaDamp
repository's definitions (stsievert/adadamp, ``adadamp/damping.py`` at c26bc46) and the
cap-then-decay rule. The damping is rounded up to an integer as damptune does for every damper
(the repository rounds AdaDamp and PadaDamp up, CntsDampLR to nearest and leaves GeoDamp's
unrounded); PadaDamp is its documented ``B0 + ⌈rate·k⌉`` (the repository's code also ramps it
by ``1 − exp(−0.003 k)``, which damptune does not).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from damptune import DAMPERS, ConfigError, Progress, get_damper

TRAJECTORY = json.loads((Path(__file__).parent / "data" / "trajectory.json").read_text())
ROWS = TRAJECTORY["updates"]
N = len(ROWS)
EPOCH = np.array([r["epoch"] for r in ROWS])
LOSS = np.array([r["loss"] for r in ROWS])
G2 = np.array([r["grad_sq_norm"] for r in ROWS])
TRAIN_LOSS = {r["update"]: r["train_loss"] for r in ROWS if "train_loss" in r}
K = np.arange(N)
LR0 = 0.05
EPS = 1e-9  # damptune's guard of ceil() against float fuzz

# (damper, hyperparameters, max_batch_size); a cap below the damping exercises the lr decay
SETTINGS: list[tuple[str, dict[str, Any], int]] = [
    ("sgd", {"initial": 32}, 1024),
    ("sgd", {"initial": 8, "dwell": 3}, 4),
    ("geodamplr", {"initial": 32, "factor": 2, "delay": 1}, 1024),
    ("geodamplr", {"initial": 16, "factor": 10, "delay": 0.5, "dwell": 7}, 1024),
    ("cntsdamplr", {"initial": 32, "c": 0.1}, 1024),
    ("cntsdamplr", {"initial": 16, "c": 0.37, "dwell": 4}, 1024),
    ("geodamp", {"initial": 32, "factor": 2, "delay": 1}, 1024),
    ("geodamp", {"initial": 32, "factor": 3, "delay": 0.75}, 64),
    ("geodamp", {"initial": 16, "factor": 1.5, "delay": 0.5, "dwell": 7}, 48),
    ("padadamp", {"initial": 32, "rate": 1.0}, 1024),
    ("padadamp", {"initial": 8, "rate": 0.3}, 64),
    ("padadamp", {"initial": 32, "rate": 2.5, "dwell": 7}, 256),
    ("adadamp", {"initial": 32, "dwell": 10}, 1024),
    ("adadamp", {"initial": 16, "dwell": 20}, 24),
    ("adadamp", {"initial": 32, "dwell": 10, "f_star": 0.5}, 40),
    ("radadamp", {"initial": 32, "rho": 0.9}, 1024),
    ("radadamp", {"initial": 32, "rho": 0.5}, 40),
    ("radadamp", {"initial": 16, "rho": 0.99, "warmup": 20, "dwell": 3}, 1024),
]


def _train_loss(k: int) -> float:
    if k not in TRAIN_LOSS:
        raise AssertionError(f"train_loss asked at update {k}: recorded every 10 updates")
    return TRAIN_LOSS[k]


def progress(k: int) -> Progress:
    """What the engine shows a damper before update ``k``."""
    row, prev = ROWS[k], ROWS[k - 1] if k else None
    return Progress(update=k, epoch=row["epoch"], examples_seen=row["examples_seen"],
                    loss=prev["loss"] if prev else None,
                    grad_sq_norm=prev["grad_sq_norm"] if prev else None,
                    train_loss=lambda k=k: _train_loss(k))


def replay(damper: Any, cap: int, updates: range = range(N)) -> list[Any]:
    """Steps of ``updates``, in the engine's order: step before the update, observe after."""
    steps = []
    for k in updates:
        steps.append(damper.step(progress(k), lr0=LR0, max_batch_size=cap))
        damper.observe(loss=ROWS[k]["loss"], grad_sq_norm=ROWS[k]["grad_sq_norm"])
    return steps


# -- the reference rules, over the recorded arrays ------------------------------------------
def radadamp_raw(b0: float, rho: float, warmup: int = 50, weight: float = 5.0) -> np.ndarray:
    """RadaDamp: B0 until update ``warmup``; R0 = mean of 5·loss + g² over updates 1..warmup;
    EMAs from the warm-up means; d = B0·max(1, R0 / (5·ema_loss + ema_g²))."""
    mean_loss, mean_g2 = LOSS[1:warmup + 1].mean(), G2[1:warmup + 1].mean()
    r0 = weight * mean_loss + mean_g2
    ema_loss, ema_g2 = np.full(N, np.nan), np.full(N, np.nan)  # after observing update j
    ema_loss[warmup], ema_g2[warmup] = mean_loss, mean_g2
    for j in range(warmup + 1, N):
        ema_loss[j] = rho * ema_loss[j - 1] + (1 - rho) * LOSS[j]
        ema_g2[j] = rho * ema_g2[j - 1] + (1 - rho) * G2[j]
    raw = np.full(N, float(b0))
    after = K[warmup + 1:]  # the damping of update k sees the EMAs through update k-1
    raw[after] = b0 * np.maximum(1.0, r0 / (weight * ema_loss[after - 1] + ema_g2[after - 1]))
    return raw


def reference_raw(name: str, p: dict[str, Any]) -> np.ndarray:
    """The damping before rounding, recomputed at every update."""
    b0 = p["initial"]
    if name == "sgd":
        return np.full(N, float(b0))
    if name in ("geodamp", "geodamplr"):
        return b0 * p["factor"] ** (EPOCH // p["delay"])
    if name == "padadamp":
        return b0 + np.ceil(p["rate"] * K)
    if name == "cntsdamplr":
        return b0 + 1 + p["c"] * (K + 1)
    if name == "adadamp":  # F at the update's weights; only looked at where it was recorded
        f = np.array([TRAIN_LOSS.get(k, np.nan) for k in K]) - p.get("f_star", 0.0)
        return np.ceil(b0 * f[0] / f)
    if name == "radadamp":
        return radadamp_raw(b0, p["rho"], p.get("warmup", 50))
    raise AssertionError(name)


def reference(name: str, p: dict[str, Any], cap: int) -> tuple[np.ndarray, ...]:
    """Damping (held for ``dwell`` updates), batch size and lr by cap-then-decay."""
    dwell = p.get("dwell", 1)  # the settings give adadamp's (default 10) explicitly
    d = np.ceil(reference_raw(name, p) - EPS)[(K // dwell) * dwell]
    cap = p["initial"] if DAMPERS[name].lr_only else cap
    batch = np.minimum(d, cap)
    lr = np.where(d <= cap, LR0, LR0 * cap / d)
    return d, batch, lr


# -- the tests ------------------------------------------------------------------------------
def _id(setting: tuple[str, dict[str, Any], int]) -> str:
    name, p, cap = setting
    return f"{name}-" + "-".join(f"{k}{v}" for k, v in sorted(p.items())) + f"-cap{cap}"


def test_settings_cover_every_damper():
    assert {name for name, _, _ in SETTINGS} == set(DAMPERS)
    assert TRAJECTORY["meta"]["n_train"] > 0 and N == 400


@pytest.mark.parametrize("setting", SETTINGS, ids=_id)
def test_damper_matches_reference_every_update(setting):
    name, p, cap = setting
    steps = replay(get_damper(name, **p), cap)
    d, batch, lr = reference(name, p, cap)
    for k, s in enumerate(steps):
        assert (s.damping, s.batch_size) == (d[k], batch[k]), f"update {k}"
        assert s.lr == pytest.approx(lr[k], rel=1e-12), f"update {k}"
    effective_cap = p["initial"] if DAMPERS[name].lr_only else cap
    if effective_cap < 1024 or name == "geodamplr":
        assert (d > effective_cap).any(), "the setting never reaches the lr-decay branch"
    if name != "sgd":
        assert len(set(d)) > 1, "the setting never moves the damping"


def test_radadamp_grows_on_recorded_trajectory_and_rho_matters():
    trajectories = {}
    for rho in (0.5, 0.9, 0.99):
        steps = replay(get_damper("radadamp", initial=32, rho=rho), cap=10_000)
        trajectories[rho] = [s.damping for s in steps]
        assert trajectories[rho][:51] == [32] * 51  # B0 until R0 is known (updates 0..50)
        assert min(trajectories[rho]) == 32
        assert max(trajectories[rho]) > 32
    assert trajectories[0.5] != trajectories[0.9] != trajectories[0.99]


def test_radadamp_warmup_is_validated():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="batch_size__warmup"):
            get_damper("radadamp", warmup=bad).step(progress(0), lr0=LR0, max_batch_size=64)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s[0] == "radadamp"]
                         + [s for s in SETTINGS if s[0] != "radadamp"][::2], ids=_id)
@pytest.mark.parametrize("at", [30, 200])
def test_state_dict_resumes_exactly(setting, at):
    """state_dict after ``at`` updates (radadamp: in its warm-up at 30, in the EMAs at 200),
    through pickle into a fresh damper: the rest of the trajectory is the same."""
    name, p, cap = setting
    whole = replay(get_damper(name, **p), cap)
    first = get_damper(name, **p)
    replay(first, cap, range(at))
    resumed = get_damper(name, **p)
    resumed.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
    assert replay(resumed, cap, range(at, N)) == whole[at:]
    assert replay(first, cap, range(at, N)) == whole[at:]
