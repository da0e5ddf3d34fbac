import math

import pytest

from damptune import DAMPERS, ConfigError, Progress, get_damper
from damptune.dampers import GeoDamp, Param


def run_schedule(damper, *, updates=400, per_epoch=20, lr0=1.0, cap=64):
    """Drive a damper through a fake training run with a decreasing loss."""
    steps = []
    for k in range(updates):
        loss = 2.0 / (1 + 0.05 * k)
        progress = Progress(update=k, epoch=k / per_epoch, examples_seen=k * 10,
                            loss=loss, grad_sq_norm=loss / 3, train_loss=lambda loss=loss: loss)
        step = damper.step(progress, lr0=lr0, max_batch_size=cap)
        damper.observe(loss=loss, grad_sq_norm=loss / 3)
        steps.append(step)
    return steps


def test_geodamp_reference_schedule_from_design():
    """B0=4, cap 8, delay 3, factor 2: batch sizes {4, 8}, lr 1, 1/2, 1/4 ..., damping 4..128."""
    damper = GeoDamp(initial=4, factor=2, delay=3)
    steps = [damper.step(Progress(update=e, epoch=e), lr0=1.0, max_batch_size=8)
             for e in range(18)]
    assert {s.batch_size for s in steps} == {4, 8}
    assert [s.damping for s in steps[::3]] == [4, 8, 16, 32, 64, 128]
    assert [s.lr for s in steps[::3]] == [1, 1, 0.5, 0.25, 0.125, 0.0625]
    dampings = [s.damping for s in steps]
    assert dampings == sorted(dampings)
    assert [s.batch_size for s in steps] == sorted(s.batch_size for s in steps)


@pytest.mark.parametrize("name", sorted(DAMPERS))
def test_damper_noise_scale_invariant_every_update(name):
    damper = get_damper(name, initial=8)
    for s in run_schedule(damper, lr0=0.1):
        assert s.batch_size / s.lr == pytest.approx(s.damping / 0.1, rel=1e-12)
        assert 1 <= s.batch_size <= 64


@pytest.mark.parametrize("name", ["geodamplr", "cntsdamplr", "sgd"])
def test_lr_only_dampers_keep_batch_size_constant(name):
    steps = run_schedule(get_damper(name, initial=16))
    assert {s.batch_size for s in steps} == {16}


def test_geodamplr_is_step_lr_decay():
    damper = get_damper("geodamplr", initial=16, factor=10, delay=2)
    steps = run_schedule(damper, per_epoch=20)
    for k, s in enumerate(steps):
        assert s.lr == pytest.approx(1.0 / 10 ** math.floor((k / 20) / 2))


def test_cntsdamplr_follows_documented_lr():
    damper = get_damper("cntsdamplr", initial=16, c=0.5)
    for k, s in enumerate(run_schedule(damper)):
        assert s.lr == pytest.approx(16 / (16 + 1 + 0.5 * (k + 1)), rel=1 / 16)


def test_padadamp_grows_linearly_in_updates():
    steps = run_schedule(get_damper("padadamp", initial=8, rate=0.5), cap=10_000)
    assert [s.damping for s in steps[:5]] == [8, 9, 9, 10, 10]
    assert steps[399].damping == math.ceil(8 + 0.5 * 399)


def test_adadamp_grows_as_loss_falls():
    steps = run_schedule(get_damper("adadamp", initial=8, dwell=1), cap=10_000)
    assert steps[0].damping == 8
    # loss(k) = 2 / (1 + 0.05 k): d = 8 * (1 + 0.05 k)
    assert steps[200].damping == math.ceil(8 * (1 + 0.05 * 200))


def test_radadamp_never_below_initial_and_grows():
    steps = run_schedule(get_damper("radadamp", initial=8, rho=0.5), cap=10_000)
    assert min(s.damping for s in steps) == 8
    assert steps[-1].damping > 8 * 5


def test_dwell_holds_damping_between_recomputations():
    steps = run_schedule(get_damper("padadamp", initial=8, rate=1.0, dwell=5), cap=10_000)
    for block in range(0, 100, 5):
        assert len({s.damping for s in steps[block:block + 5]}) == 1
    assert steps[5].damping == 13


@pytest.mark.parametrize("name", sorted(DAMPERS))
def test_damper_state_round_trip_continues_exactly(name):
    a = get_damper(name, initial=8, dwell=3)
    first = run_schedule(a, updates=50)
    b = get_damper(name, initial=8, dwell=3)
    b.load_state_dict(a.state_dict())
    progress = [Progress(update=50 + i, epoch=(50 + i) / 20, loss=0.1, grad_sq_norm=0.01,
                         train_loss=lambda: 0.1) for i in range(30)]
    out_a = [a.step(p, lr0=1.0, max_batch_size=64) for p in progress]
    out_b = [b.step(p, lr0=1.0, max_batch_size=64) for p in progress]
    assert out_a == out_b and first


@pytest.mark.parametrize("name", sorted(DAMPERS))
def test_damper_declares_search_space(name):
    cls = DAMPERS[name]
    for p in cls.search_space:
        assert isinstance(p, Param) and p.low < p.high
        assert p.name in cls().get_params()
    clipped = cls.space(max_epochs=5)
    assert all(p.high <= 5 for p in clipped if p.unit == "epochs")
    if name not in ("sgd",):
        assert cls.search_space, f"{name} declares no hyperparameters"


def test_unknown_damper_error_names_accepted_values():
    with pytest.raises(ConfigError, match=r"batch_size='nope'.*adadamp.*radadamp"):
        get_damper("nope")


def test_bad_hyperparameter_error_names_parameter():
    damper = get_damper("geodamp", factor=-2)
    with pytest.raises(ConfigError, match="batch_size__factor"):
        damper.step(Progress(update=0), lr0=1.0, max_batch_size=64)
    with pytest.raises(ConfigError, match="batch_size__initial"):
        get_damper("sgd", initial=0).step(Progress(update=0), lr0=1.0, max_batch_size=64)
    with pytest.raises(ConfigError, match="batch_size__"):
        get_damper("geodamp", rate=3)


def test_damper_parameter_protocol_is_scikit_learns():
    from sklearn.base import clone

    damper = GeoDamp(initial=8, factor=3)
    assert damper.get_params() == {"delay": 10, "dwell": 1, "factor": 3, "initial": 8}
    twin = clone(damper)
    assert type(twin) is GeoDamp and twin.get_params() == damper.get_params()
    assert twin.set_params(delay=4) is twin and twin.delay == 4 and damper.delay == 10
    with pytest.raises(ValueError, match="rate"):
        twin.set_params(rate=1.0)
    assert repr(twin) == "GeoDamp(delay=4, dwell=1, factor=3, initial=8)"
