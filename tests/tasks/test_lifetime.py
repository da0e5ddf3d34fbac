"""``max_cluster_lifetime``: the durations it accepts (``damptune.interrupt.parse_duration``)
and when trials must checkpoint and stop (``tasks.session.lifetime_deadline``: the cluster's
start plus the lifetime, less a margin of two checkpoint intervals, at least a minute, at most
half the lifetime)."""

import pytest

from damptune import ConfigError
from damptune.interrupt import parse_duration
from tasks.grid import GridSettings
from tasks.session import lifetime_deadline


@pytest.mark.parametrize(("given", "seconds"), [
    ("6h", 21600.0), ("90m", 5400.0), ("45s", 45.0), ("1d", 86400.0), ("3600", 3600.0),
    (" 2H ", 7200.0), ("0.5h", 1800.0), ("1.5m", 90.0), ("6 h", 21600.0), ("1e3s", 1000.0),
    (3600, 3600.0), (2.5, 2.5),
])
def test_durations_in_each_unit_are_seconds(given, seconds):
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("given", [None, ""])
def test_no_lifetime_is_none(given):
    assert parse_duration(given) is None


@pytest.mark.parametrize("given", [
    "soon", "0", "0h", "-5m", "h", "5ms", "6 hours", "nan", "inf", "1e309", "-inf", 0, -60,
    0.0, float("inf"), float("nan"), True, False,
])
def test_a_bad_lifetime_is_refused_naming_the_parameter_the_value_and_what_is_accepted(given):
    """Zero, negative, unknown units, words, a boolean and an endless "duration" are refused,
    with the parameter's name, the value given and examples of what is accepted."""
    with pytest.raises(ConfigError) as refused:
        parse_duration(given)
    message = str(refused.value)
    assert refused.value.param == "max_cluster_lifetime"
    assert message.startswith(f"max_cluster_lifetime={given!r} is not accepted"), message
    assert "'6h'" in message and "'90m'" in message, message


STARTED = 1_000_000.0  # a scheduler's start, time.time()


def deadline(lifetime, checkpoint_seconds):
    settings = GridSettings(max_cluster_lifetime=lifetime, checkpoint_seconds=checkpoint_seconds)
    return lifetime_deadline(STARTED, settings)


@pytest.mark.parametrize(("lifetime", "checkpoint_seconds", "expected"), [
    (21600.0, 30.0, STARTED + 21540.0),  # 6 h, the default interval: a minute before
    (21600.0, 120.0, STARTED + 21360.0),  # grid-spot's 120 s: two intervals, 4 minutes
    (21600.0, 0.5, STARTED + 21540.0),  # short intervals: still a minute
    (21600.0, 30.001, STARTED + 21600.0 - 60.002),  # two intervals just over a minute
    (3600.0, 1800.0, STARTED + 1800.0),  # two intervals would be the whole life: half of it
    (120.0, 30.0, STARTED + 60.0),  # a minute is half the lifetime: both bounds agree
    (100.0, 30.0, STARTED + 50.0),  # under two minutes: half the lifetime
    (2.0, 0.5, STARTED + 1.0),
])
def test_the_deadline_is_the_lifetime_less_two_intervals_at_least_a_minute_at_most_half(
        lifetime, checkpoint_seconds, expected):
    assert deadline(lifetime, checkpoint_seconds) == pytest.approx(expected, abs=1e-6)


def test_the_margin_never_exceeds_half_the_lifetime_nor_falls_below_a_minute_when_it_fits():
    """Over lifetimes and intervals around the bounds: the deadline always leaves at least half
    the lifetime to train and lands before the cluster's end."""
    for lifetime in (1.0, 59.0, 119.0, 120.0, 121.0, 600.0, 86400.0):
        for interval in (0.5, 29.0, 30.0, 31.0, 300.0, 7200.0):
            margin = STARTED + lifetime - deadline(lifetime, interval)
            assert 0 < margin <= lifetime / 2, (lifetime, interval, margin)
            assert margin >= min(60.0, lifetime / 2), (lifetime, interval, margin)
            assert margin >= min(2 * interval, lifetime / 2), (lifetime, interval, margin)
