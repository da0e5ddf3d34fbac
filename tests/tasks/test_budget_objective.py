"""The budget objective (``objective="budget"``, the AdaDamp paper's): a trial's value is the
simulated time of its whole budget when its final accuracy (the moving average of test
accuracy over the last half epoch of examples) reaches the target, else that time scaled up
by the shortfall, with the shortfall as its constraint. The values are worked out by hand
from histories whose numbers are chosen so that each rule gives another answer."""

import pytest

from tasks.objective import final_accuracy, outcome, window_means

N = 1000  # examples per epoch: the window of half an epoch is 500 examples


def history(points):
    """An update then an evaluation at each (examples seen, accuracy, simulated s)."""
    out = []
    for examples, accuracy, time_sim in points:
        out.append({"kind": "update", "examples_seen": examples, "time_sim": time_sim})
        out.append({"kind": "eval", "examples_seen": examples, "test_accuracy": accuracy,
                    "time_sim": time_sim})
    return out


# it touches 0.7 at 1,000 examples (2.0 s), then falls back; its budget ends at 2,000 (4.0 s)
# with evaluations 0.6, 0.5, 0.6 over its last 500 examples: the average is (0.55 + 0.55) / 2
FALLS_BACK = history([(500, 0.4, 1.0), (1000, 0.7, 2.0), (1500, 0.6, 3.0), (1750, 0.5, 3.5),
                      (2000, 0.6, 4.0)])


def test_the_final_accuracy_is_the_examples_weighted_average_of_the_last_half_epoch():
    evals = [r for r in FALLS_BACK if r["kind"] == "eval"]
    assert final_accuracy(evals, 0.5 * N) == pytest.approx(0.55)
    # the window's edge inside a segment: 1,800 to 2,000 is 0.52 to 0.6 (mean 0.56)
    assert final_accuracy(evals, 200) == pytest.approx(0.56)
    assert window_means(evals, "test_accuracy", 0.5 * N)[-1] == final_accuracy(evals, 0.5 * N)
    assert final_accuracy([], 0.5 * N) == 0.0


def test_a_budget_whose_final_accuracy_reaches_the_target_is_valued_at_its_whole_time():
    out = outcome(FALLS_BACK, target=0.55, kind="budget", window=0.5 * N)
    assert (out.value, out.reached, out.shortfall) == (4.0, True, 0.0)
    assert out.best_accuracy == pytest.approx(0.7)


def test_a_touch_of_the_target_that_does_not_last_is_a_miss_of_the_budget_objective():
    """0.7 was touched at 2.0 s: the time-to-target objective stops there; the budget one
    sees the final 0.55 and misses 0.6 by 0.05: 4.0 s × (1 + 0.05 / 0.6), constraint 0.05."""
    first = outcome(FALLS_BACK, target=0.6, kind="target")
    assert (first.value, first.reached, first.shortfall) == (2.0, True, 0.0)
    out = outcome(FALLS_BACK, target=0.6, kind="budget", window=0.5 * N)
    assert not out.reached
    assert out.value == pytest.approx(4.0 * (1 + 0.05 / 0.6))
    assert out.shortfall == pytest.approx(0.05)


def test_the_target_objectives_miss_reads_the_best_accuracy():
    out = outcome(FALLS_BACK, target=0.8, kind="target")
    assert not out.reached
    assert out.value == pytest.approx(4.0 * (1 + 0.1 / 0.8))
    assert out.shortfall == pytest.approx(0.1)
