"""bench/answer_stability.py's four measures over constructed answers: calibration, type-S,
headline spread, baseline CV, and the verdict that needs all four."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from bench import answer_stability as stability
from bench import records


def row(network: int, model: str, algorithm: str, values: list[float], speedup=None,
        interval=(None, None), reliable: bool = True) -> dict:
    """An answer row as ``tasks.stats.answer_rows`` makes it (the fields the measures read)."""
    return {"network": network, "model": model, "algorithm": algorithm,
            "values": dict(enumerate(values)), "mean": statistics.fmean(values),
            "n_seeds": len(values), "speedup": speedup, "speedup_low": interval[0],
            "speedup_high": interval[1], "reliable": reliable}


def answer(shift: float = 0.0, damped_speedup: float = 1.25, baseline_mean: float = 1.0,
           sign: int = 1) -> list[dict]:
    """Two (network, model) pairs, the baseline and two damped algorithms each; ``shift``
    moves every value, ``sign`` -1 makes geodamp significantly slower than the baseline."""
    rows = []
    for network in (2, 4):
        base = [baseline_mean + d for d in (0.0, 0.1, -0.1, 0.05)]
        interval = (1.2, 1.3) if sign > 0 else (0.7, 0.9)
        rows += [row(network, "cnn", "geodamplr", base, 1.0, (1.0, 1.0)),
                 row(network, "cnn", "geodamp", [v * 0.8 + shift for v in base],
                     damped_speedup if sign > 0 else 0.8, interval),
                 row(network, "cnn", "padadamp", [v * 0.9 + shift for v in base], 1.1,
                     (0.95, 1.2)),
                 row(network, "cnn", "cntsdamplr", [v * 0.5 for v in base], 2.0, (1.9, 2.1))]
    return rows


def test_z_score_is_the_difference_over_the_standard_errors_of_the_seed_values():
    a, b = row(2, "cnn", "geodamp", [1.0, 1.2, 1.1]), row(2, "cnn", "geodamp", [1.5, 1.7])
    se = math.sqrt(statistics.variance([1.0, 1.2, 1.1]) / 3 + statistics.variance([1.5, 1.7]) / 2)
    assert stability.z_score(a, b) == pytest.approx((1.1 - 1.6) / se)
    a["ci"] = 99.0  # the interval is not read: se comes from the values
    assert stability.z_score(a, b) == pytest.approx((1.1 - 1.6) / se)
    assert stability.z_score(a, row(2, "cnn", "geodamp", [1.5])) is None  # 1 seed: no se


def test_calibration_of_a_calibrated_pair_is_0_and_a_shifted_row_is_counted():
    calibrated = stability.calibration(answer(), answer(shift=0.01))
    assert (calibrated["rows"], calibrated["outside"], calibrated["share"]) == (8, 0, 0.0)
    shifted = answer()
    shifted[1] = row(2, "cnn", "geodamp", [v + 0.5 for v in shifted[1]["values"].values()])
    c = stability.calibration(answer(), shifted)
    assert (c["rows"], c["outside"], c["share"]) == (8, 1, 1 / 8)
    (key, z), *_ = c["worst"]  # the worst row first
    assert key == (2, "cnn", "geodamp") and z < -1.96


def test_calibration_skips_rows_not_in_both_answers_or_with_one_seed():
    a = [row(2, "cnn", "geodamp", [1.0, 1.1]), row(2, "cnn", "adadamp", [1.0]),
         row(4, "cnn", "geodamp", [1.0, 1.1])]
    b = [row(2, "cnn", "geodamp", [1.0, 1.1]), row(2, "cnn", "adadamp", [1.0, 1.1])]
    assert stability.calibration(a, b)["rows"] == 1
    assert stability.calibration(a, [])["share"] is None


def test_type_s_counts_opposite_significant_speedups_only():
    assert stability.type_s(answer(), answer()) == []
    found = stability.type_s(answer(), answer(sign=-1))
    assert [(k, sa, sb) for k, sa, sb in found] == [((2, "cnn", "geodamp"), 1.25, 0.8),
                                                    ((4, "cnn", "geodamp"), 1.25, 0.8)]
    # padadamp's interval holds 1 in both: not a sign error whatever its point estimates
    assert all(k[2] != "padadamp" for k, _, _ in found)


def test_headline_spread_is_the_max_over_the_min_of_the_best_reliable_damped_speedup():
    spread = stability.headline_spread([answer(), answer(damped_speedup=1.5)])
    assert spread[2, "cnn"] == {"best": [1.25, 1.5], "spread": pytest.approx(1.2)}
    # cntsdamplr (2.0x) does not grow the batch; an unreliable row or geodamp-matched:
    rows = answer() + [row(2, "cnn", "radadamp", [0.5, 0.6], 1.9, reliable=False),
                       row(2, "cnn", "geodamp-matched", [0.7, 0.8], 1.4)]
    assert stability.headline(rows) == {(2, "cnn"): 1.4, (4, "cnn"): 1.25}
    assert stability.headline_spread([answer(), [r for r in answer() if r["network"] == 2]])[
        4, "cnn"]["spread"] is None  # no headline in one grid: no spread


def test_baseline_cv_is_per_model_or_per_network_where_the_baseline_differs():
    cv = stability.baseline_cv([answer(), answer(baseline_mean=1.1)])
    expected = statistics.stdev([1.0125, 1.1125]) / statistics.fmean([1.0125, 1.1125])
    assert cv == {"cnn": pytest.approx(expected)}
    differs = answer(baseline_mean=1.1)
    differs[4] = row(4, "cnn", "geodamplr", [2.0, 2.2])
    cv = stability.baseline_cv([answer(), differs])
    assert set(cv) == {"n2 cnn", "n4 cnn"}
    assert cv["n2 cnn"] == pytest.approx(expected)


def test_the_verdict_is_met_only_when_all_four_goals_are():
    ok = stability.measures({0: answer(), 1: answer(shift=0.01), 2: answer(shift=-0.01)})
    assert ok["met"] == {"calibration": True, "type_s": True, "headline_spread": True,
                         "baseline_cv": True, "all": True}
    assert set(ok["calibration"]) == {"0-1", "0-2", "1-2"}  # every pair of the 3 grids
    shifted = answer()
    shifted[1] = row(2, "cnn", "geodamp", [v + 0.5 for v in shifted[1]["values"].values()],
                     1.25, (1.2, 1.3))
    for missed, other in (("calibration", shifted), ("type_s", answer(sign=-1)),
                          ("headline_spread", answer(damped_speedup=1.5)),
                          ("baseline_cv", answer(baseline_mean=1.1))):
        m = stability.measures({0: answer(), 1: other})
        assert not m["met"][missed] and not m["met"]["all"], missed
        assert records.verdict_of(m["met"]["all"]) == records.NOT_MET
    assert records.verdict_of(ok["met"]["all"]) == records.MET


def test_figures_hold_each_measure_per_pair_network_and_model():
    m = stability.measures({0: answer(), 1: answer(sign=-1)})
    figures = stability.measure_figures(m)
    assert figures["calibration"]["0-1"] == {"rows": 8, "outside": 0, "share": 0.0}
    assert figures["type_s"] == {"0-1": 2}
    assert figures["headline_spread"] == {"n2 cnn": pytest.approx(1.25 / 1.1),
                                          "n4 cnn": pytest.approx(1.25 / 1.1)}
    assert figures["baseline_cv"] == {"cnn": 0.0} and figures["grids"] == 2
    assert json.loads(json.dumps(records._clean(figures)))["met"]["all"] is False  # as data


def test_stage_seconds_sums_each_stages_trials_the_baselines_repeats_apart(tmp_path):
    """What each part of the answer cost: trial seconds per stage of a grid's storage, the
    baseline's replicas counted as ``replica``, not as ``search``."""
    import datetime

    import optuna

    from bench.answer_stability import stage_seconds

    storage = f"sqlite:///{tmp_path}/optuna.db"
    start = datetime.datetime(2026, 1, 1)
    for name, stage, replica, seconds in (("g/n2/sgd/mlp", "search", 0, [1.0, 2.0]),
                                          ("g/n2/sgd/mlp/r1", "search", 1, [4.0]),
                                          ("g/n2/sgd/mlp/selection", "selection", 0, [8.0])):
        study = optuna.create_study(study_name=name, storage=storage)
        study.set_user_attr("stage", stage)
        study.set_user_attr("replica", replica)
        for s in seconds:
            trial = optuna.trial.create_trial(value=1.0)
            trial.datetime_start = start
            trial.datetime_complete = start + datetime.timedelta(seconds=s)
            study.add_trial(trial)
    assert stage_seconds(str(tmp_path)) == {"replica": 4.0, "search": 3.0, "selection": 8.0}
