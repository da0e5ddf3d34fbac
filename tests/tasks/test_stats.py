"""The answer's statistics: paired ratios, means with intervals, the tied-best set."""

import math

import pytest

from tasks.stats import answer_rows, compare_pair, mean_ci, paired_ratio, seeds_to_resolve


def _row(algorithm, values, network=4, model="mlp"):
    return {"network": network, "model": model, "algorithm": algorithm, "values": values,
            "reached": {s: True for s in values}, "params": {}, "validates": ""}


def test_mean_ci_is_the_student_t_interval():
    mean, half = mean_ci([10.0, 12.0, 14.0])
    assert mean == 12.0
    assert half == pytest.approx(4.303 * 2.0 / math.sqrt(3), rel=1e-3)  # t(0.975, 2) = 4.303
    assert mean_ci([5.0]) == (5.0, None)


def test_paired_ratio_cancels_what_a_seed_does_to_both():
    # the seeds move both algorithms by up to 2x; the ratio is 2 on every seed
    base = {1: 10.0, 2: 20.0, 3: 15.0}
    other = {s: v / 2 for s, v in base.items()}
    low, mid, high = paired_ratio(base, other)
    assert (low, mid, high) == pytest.approx((2.0, 2.0, 2.0))
    assert paired_ratio(base, {9: 1.0}) == (None, None, None)  # no seed in common


def test_compare_pair_names_the_tied_best_set_and_paired_speedups():
    rows = compare_pair([
        _row("geodamplr", {1: 10.0, 2: 12.0, 3: 11.0, 4: 10.5}),
        _row("geodamp", {1: 5.0, 2: 6.1, 3: 5.4, 4: 5.2}),  # clearly faster
        _row("padadamp", {1: 5.1, 2: 5.9, 3: 5.6, 4: 5.1}),  # as fast as geodamp
    ], baseline="geodamplr")
    by = {r["algorithm"]: r for r in rows}
    assert [r["algorithm"] for r in rows][0] in ("geodamp", "padadamp")
    assert by["geodamp"]["tied_best"] and by["padadamp"]["tied_best"]
    assert not by["geodamplr"]["tied_best"]
    assert by["geodamp"]["speedup_low"] > 1.8 and by["geodamplr"]["speedup"] == 1.0
    assert seeds_to_resolve(rows) is not None  # tied: more seeds could tell them apart


def _ratios(algorithm, base, ratios):
    return _row(algorithm, {s: base[s] * r for s, r in zip(sorted(base), ratios, strict=True)})


def test_the_tied_best_set_is_family_wise_over_the_comparisons_with_the_best():
    base = {s: 10.0 + s for s in range(1, 9)}
    # 1.04x the best, per seed ratios that a plain 95 % interval calls slower (its low end is
    # about 1.008) but a Bonferroni interval over 6 comparisons does not (about 0.992)
    near = [1.09, 0.99, 1.08, 1.00, 1.07, 1.01, 1.04, 1.04]
    low, _, _ = paired_ratio(_ratios("x", base, near)["values"], base)
    assert low > 1.0  # significantly slower on its own
    far = [1.5] * 4 + [1.6] * 4
    others = [_ratios(f"slow{i}", base, [f + i / 10 for f in far]) for i in range(4)]
    rows = compare_pair([_row("best", base), _ratios("near", base, near), *others,
                         _row("geodamplr", {s: 2 * v for s, v in base.items()})],
                        baseline="geodamplr")
    by = {r["algorithm"]: r for r in rows}
    assert by["near"]["tied_best"] and by["best"]["tied_best"]  # 6 comparisons: tied
    assert not any(by[f"slow{i}"]["tied_best"] for i in range(4))
    # the same two algorithms alone make one comparison: the plain interval, which tells them
    # apart, so the set shrinks to the best
    two = {r["algorithm"]: r for r in compare_pair([_row("best", base),
                                                     _ratios("near", base, near)],
                                                    baseline="best")}
    assert two["best"]["tied_best"] and not two["near"]["tied_best"]
    assert two["near"]["vs_best_low"] == pytest.approx(low)


def test_two_algorithms_as_fast_as_each_other_are_not_told_apart_by_a_seed_count():
    from tasks.answer import answer_markdown

    base = {s: 10.0 + s for s in range(1, 9)}
    # means within 0.01 % of each other, seed by seed noise of about 2 %: no seed count resolves
    same = _ratios("padadamp", base, [1.02, 0.98, 1.021, 0.979, 1.0, 1.0, 1.0, 1.0002])
    close = _ratios("adadamp", base, [1.06, 0.98, 1.05, 0.99, 1.03, 1.01, 1.02, 1.02])
    for other, says in ((same, "Not even 10,000 held-out seeds"), (close, "About ")):
        rows = answer_rows([_row("geodamp", base), other,
                            _row("geodamplr", {s: 2 * v for s, v in base.items()})],
                           baseline="geodamplr")
        text = answer_markdown(rows)
        assert "**Indistinguishable**" in text and says in text, text
        assert "10000" not in text  # never the cap printed as a count


def test_answer_rows_rank_each_pair_separately():
    rows = answer_rows([_row("geodamplr", {1: 10.0, 2: 11.0}, network=2),
                        _row("geodamp", {1: 9.0, 2: 9.5}, network=2),
                        _row("geodamp", {1: 4.0, 2: 4.5}, network=4)], baseline="geodamplr")
    assert [(r["network"], r["rank"], r["algorithm"]) for r in rows] == [
        (2, 1, "geodamp"), (2, 2, "geodamplr"), (4, 1, "geodamp")]
    assert rows[2]["speedup"] is None  # no baseline at n4 in these rows


def test_a_configuration_that_mostly_misses_the_target_is_never_the_best():
    # its penalized time is low (it stopped at the budget), but it missed on every seed
    missed = {**_row("padadamp", {1: 4.0, 2: 4.1, 3: 4.0}), "reached": {1: False, 2: False,
                                                                        3: False}}
    rows = compare_pair([_row("geodamplr", {1: 10.0, 2: 12.0, 3: 11.0}),
                         _row("geodamp", {1: 8.0, 2: 9.0, 3: 8.5}), missed],
                        baseline="geodamplr")
    assert [r["algorithm"] for r in rows] == ["geodamp", "geodamplr", "padadamp"]
    assert not rows[2]["reliable"] and not rows[2]["tied_best"]


def test_a_seed_count_near_the_cap_is_printed_and_one_beyond_it_is_not():
    import math

    from tasks.stats import RESOLVE_CAP

    base = {s: 10.0 for s in range(1, 9)}
    # per-seed log ratios m ± d: about (1.96 d / m)^2 seeds resolve them, 9,500 here
    d = 0.0093

    def needed(m):
        second = _ratios("adadamp", base, [math.exp(m + d * (-1) ** s) for s in range(8)])
        return seeds_to_resolve(compare_pair([_row("padadamp", base), second],
                                             baseline="padadamp"))

    just_under = needed(0.0002)
    assert 9_000 < just_under <= RESOLVE_CAP  # a count the answer prints
    assert needed(0.00019) == RESOLVE_CAP + 1  # beyond the cap: "not even 10,000"
