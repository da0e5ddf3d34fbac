"""The headline figure tells a user which held-out means answer for their cell."""

import pytest

from tasks.figures import time_vs_network


def _row(network, mean, **extra):
    return {"network": network, "model": "mlp", "algorithm": "padadamp", "mean": mean,
            "ci": 0.01, "replaced": [], "reliable": True, **extra}


def test_a_configuration_that_missed_on_most_held_out_seeds_is_drawn_apart():
    """Circle: the search's best answers; square: a runner-up answers; x: every candidate
    missed the target on most seeds, so its mean (fast: it stopped short) answers nothing."""
    ranking = [{"network": n, "model": "mlp", "algorithm": "padadamp", "best_value": 0.4,
                "reached": True, "target_accuracy": 0.62} for n in (2, 4, 8)]
    answer = [_row(2, 0.45), _row(4, 0.41, replaced=[{"validates": "n4/padadamp/mlp#0"}]),
              _row(8, 0.30, reliable=False, replaced=[{"validates": "n8/padadamp/mlp#0"}])]
    fig = time_vs_network({"ranking": ranking, "answer": answer, "curves": [], "profiles": []})
    held_out = [line for line in fig.axes[0].lines if line.get_linestyle() == "None"
                and line.get_marker() in ("o", "s", "x")]
    markers = {line.get_marker(): list(line.get_ydata()) for line in held_out}
    assert markers == {"o": [pytest.approx(0.45)], "s": [pytest.approx(0.41)],
                       "x": [pytest.approx(0.30)]}, markers
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "missed the target on most held-out seeds" in labels


def test_profiles_of_nearly_one_ratio_share_one_tick_on_the_speedup_figure():
    """Two profiles whose compute : communication ratios are within 1.3× of each other would
    print their labels over each other on the log axis: they share one tick."""
    from tasks.figures import _merged_ticks

    ticks = _merged_ticks({"ddp-100g": 2.14, "centralized": 2.1, "decentralized-high": 224.0})
    assert ticks == [("centralized, ddp-100g (2.1)", 2.1), ("decentralized-high (224)", 224.0)]
