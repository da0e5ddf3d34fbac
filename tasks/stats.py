"""The statistics of the answer: means over held-out seeds, paired ratios, the tied-best set.

Every algorithm of a (network, model) pair is retrained on the same held-out seeds
(:mod:`tasks.validation`), so two algorithms are compared seed by seed: the ratio of their
times on one seed cancels what the seed does to both. Ratios are averaged on the log scale
(a geometric mean) with a Student-t 95 % interval. An algorithm is in the **tied-best set**
when the interval of its paired ratio to the best (lowest mean) algorithm includes 1: the data
cannot say it is slower. That interval is **family-wise**: a pair of k algorithms makes k - 1
comparisons with its best at once, so each is made at 1 - 0.05 / (k - 1) (Bonferroni), and
"every other algorithm is significantly slower" is a 95 % statement about all of them together,
not about each one (at 95 % each, a pair of 7 would call a truly tied algorithm slower with a
chance of up to 1 - 0.95**6 = 26 %). With two algorithms it is the plain 95 % interval.

Example:
    >>> lo, mid, hi = paired_ratio({1: 10.0, 2: 12.0, 3: 11.0}, {1: 5.0, 2: 6.1, 3: 5.4})
    >>> round(mid, 2), lo > 1.0
    (2.0, True)
"""

from __future__ import annotations

import math
import statistics
from typing import Any

# scipy.special, not scipy.stats: the same quantile (t.ppf is stdtrit), and the flow process
# imports it in 0.35 s instead of 1.5 s
from scipy.special import stdtrit

__all__ = ["CONFIDENCE", "mostly_reached", "mean_ci", "paired_ratio", "compare_pair",
           "family", "vs_best", "RESOLVE_CAP", "seeds_to_resolve", "answer_rows", "ANSWER_COLUMNS",
           "mechanism_ratios"]

CONFIDENCE = 0.95
# seeds_to_resolve stops counting here: two algorithms this close are, in practice, as fast
RESOLVE_CAP = 10_000


def _t(n: int, comparisons: int = 1) -> float:
    """The two-sided Student-t quantile of ``n`` values at ``CONFIDENCE``, Bonferroni-adjusted
    for ``comparisons`` made at once."""
    return float(stdtrit(n - 1, 1 - (1 - CONFIDENCE) / (2 * max(1, comparisons))))


def mostly_reached(reached: list[bool], n_seeds: int) -> bool:
    """Whether a configuration reached the target on most of its ``n_seeds`` held-out seeds
    (``reached``: one per seed it reached or missed; a seed without a result counts as a
    miss): the answer's ``reliable``, and the rule by which a validation cell retrains its
    search's runner-up (:mod:`tasks.validation`)."""
    return 2 * sum(reached) > n_seeds


def mean_ci(values: list[float], comparisons: int = 1) -> tuple[float, float | None]:
    """(mean, half-width of its 95 % interval, family-wise over ``comparisons``); no interval
    from fewer than 2 values."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, (_t(len(values), comparisons) * statistics.stdev(values)
                  / math.sqrt(len(values)))


def paired_ratio(base: dict[int, float], other: dict[int, float], comparisons: int = 1
                 ) -> tuple[float | None, float | None, float | None]:
    """``base / other`` over the seeds both have: (low, geometric mean, high) of the 95 %
    interval (family-wise over ``comparisons`` made at once); None where fewer than 2 seeds
    (1 seed: the ratio, no interval)."""
    seeds = sorted(set(base) & set(other))
    logs = [math.log(base[s] / other[s]) for s in seeds if base[s] > 0 and other[s] > 0]
    if not logs:
        return None, None, None
    mid, half = mean_ci(logs, comparisons)
    if half is None:
        return None, math.exp(mid), None
    return math.exp(mid - half), math.exp(mid), math.exp(mid + half)


def compare_pair(rows: list[dict[str, Any]], *, baseline: str) -> list[dict[str, Any]]:
    """The validation rows of one (network, model) pair with their statistics: ``mean``,
    ``ci`` (half-width), ``n_seeds``, ``speedup`` over ``baseline`` with ``speedup_low`` and
    ``speedup_high`` (paired), ``vs_best_low`` (the low end of this / best's family-wise
    interval: one of the reliable rows' comparisons with the best), ``reliable`` (reached the
    target on most seeds), ``tied_best``, and the mechanism's ratios to the baseline
    (:func:`mechanism_ratios`); sorted by mean, the reliable ones first. The best
    is the reliable one of least mean; only reliable ones tie."""
    rows = [dict(r) for r in rows if r["values"]]
    base = next((r for r in rows if r["algorithm"] == baseline), None)
    for r in rows:
        values = [r["values"][s] for s in sorted(r["values"])]
        r["mean"], r["ci"] = mean_ci(values)
        r["n_seeds"] = len(values)
        # reached the target on most seeds: a configuration that mostly misses it is ranked
        # after every one that does not, whatever its (penalized) time, as in the search
        r["reliable"] = mostly_reached([bool(v) for v in r.get("reached", {}).values()],
                                       len(values))
        low, mid, high = (paired_ratio(base["values"], r["values"]) if base
                          else (None, None, None))
        r["speedup"], r["speedup_low"], r["speedup_high"] = mid, low, high
        r.update(mechanism_ratios(r, base))
    rows.sort(key=lambda r: (not r["reliable"], r["mean"], r["algorithm"]))
    for r, (low, tied) in zip(rows, vs_best(rows, family(rows)), strict=True):
        r["vs_best_low"], r["tied_best"] = low, tied
    return rows


MECHANISM_KEYS = ("updates", "epochs")  # a mechanism's counts to the target, compared as ratios


def mechanism_ratios(row: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """How ``row`` reached the target against ``base`` (the baseline's row of its pair), from
    the ``mechanism`` of each held-out seed's trial ({seed: :func:`tasks.mechanism.mechanism`
    dict or None}), paired over the seeds on which both reached the target:
    ``updates_ratio`` and ``epochs_ratio`` (this row's model updates, and epochs, to the
    target over the baseline's: below 1 is fewer) with ``_low``/``_high``, their 95 %
    interval (:func:`paired_ratio`); and ``profile_speedups`` ({profile: (low, mid, high)}:
    the baseline's simulated seconds to the target over this row's, on each network
    profile). None where no seed pairs (no baseline; a grid from before trials recorded
    their mechanism)."""
    mine, theirs = _reached_mechanisms(row), _reached_mechanisms(base) if base else {}
    out: dict[str, Any] = {}
    for key in MECHANISM_KEYS:
        low, mid, high = paired_ratio(_field(mine, key), _field(theirs, key))
        out |= {f"{key}_ratio": mid, f"{key}_ratio_low": low, f"{key}_ratio_high": high}
    names = dict.fromkeys(p for m in (*mine.values(), *theirs.values())
                          for p in m.get("profiles") or {})
    speedups = {p: paired_ratio(_field(theirs, "profiles", p), _field(mine, "profiles", p))
                for p in names}
    out["profile_speedups"] = {p: v for p, v in speedups.items() if v[1] is not None} or None
    return out


def _reached_mechanisms(row: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The mechanisms of ``row``'s seeds that reached the target (by the row's ``reached``
    and by the mechanism's own count of updates to it)."""
    reached = {int(s): bool(v) for s, v in (row.get("reached") or {}).items()}
    return {int(s): m for s, m in (row.get("mechanism") or {}).items()
            if m and reached.get(int(s)) and m.get("updates") is not None}


def _field(mechanisms: dict[int, dict[str, Any]], key: str,
           profile: str | None = None) -> dict[int, float]:
    """{seed: the mechanism's ``key``} (with ``profile``: its seconds on that profile), the
    seeds that have one."""
    values = {s: (m.get(key) or {}).get(profile) if profile else m.get(key)
              for s, m in mechanisms.items()}
    return {s: float(v) for s, v in values.items() if v is not None}


def vs_best(rows: list[dict[str, Any]], comparisons: int) -> list[tuple[float | None, bool]]:
    """For each row of a pair ranked by :func:`compare_pair` (``reliable``, ``values``): the low
    end of its ratio to the best's interval at the level of ``comparisons``, and whether it is
    tied-best (reliable, and the data cannot say it is slower). The best is the first row when
    it is reliable; none is tied when it is not."""
    best = rows[0] if rows and rows[0]["reliable"] else None
    out: list[tuple[float | None, bool]] = []
    for r in rows:
        low = paired_ratio(r["values"], best["values"], comparisons)[0] if best else None
        out.append((low, bool(best) and bool(r["reliable"])
                    and (r is best or low is None or low <= 1.0)))
    return out


def family(rows: list[dict[str, Any]]) -> int:
    """The comparisons with the best that a pair's tied-best set makes at once: one per other
    reliable row (at least 1)."""
    return max(1, sum(bool(r["reliable"]) for r in rows) - 1)


def seeds_to_resolve(rows: list[dict[str, Any]]) -> int | None:
    """Held-out seeds that would tell the best from the runner-up at this spread (the paired
    interval's half-width shrinks as 1/sqrt(n)), at the tied-best set's family-wise level:
    None when they are told apart already; ``RESOLVE_CAP + 1`` when not even ``RESOLVE_CAP``
    would."""
    if len(rows) < 2 or not rows[1]["tied_best"]:
        return None
    best, second = rows[0], rows[1]
    seeds = sorted(set(best["values"]) & set(second["values"]))
    logs = [math.log(second["values"][s] / best["values"][s]) for s in seeds]
    if len(logs) < 2 or statistics.fmean(logs) <= 0:
        return None
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    if sd == 0:
        return None
    n = 2
    rivals = family(rows)
    while _t(n, rivals) * sd / math.sqrt(n) >= mean:
        if n == RESOLVE_CAP:
            return RESOLVE_CAP + 1
        n += 1
    return n


ANSWER_COLUMNS = ("network", "model", "rank", "algorithm", "mean", "ci", "n_seeds", "speedup",
                  "speedup_low", "speedup_high", "tied_best", "reliable", "reached_seeds",
                  "params", "validates", "replaced", "unchanged_seeds", "search_shortfall",
                  "updates_ratio", "updates_ratio_low", "updates_ratio_high", "epochs_ratio",
                  "epochs_ratio_low", "epochs_ratio_high", "profile_speedups", "selection")


def answer_rows(validation: list[dict[str, Any]], *, baseline: str) -> list[dict[str, Any]]:
    """The answer: every (network, model) pair's validation rows with their statistics
    (:func:`compare_pair`), ranked by mean; ``resolve_seeds`` on a pair's first row says how
    many seeds would tell its two best apart when they are tied."""
    pairs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in validation:
        pairs.setdefault((row["network"], row["model"]), []).append(row)
    out: list[dict[str, Any]] = []
    for key in sorted(pairs):
        ranked = compare_pair(pairs[key], baseline=baseline)
        for rank, row in enumerate(ranked, start=1):
            row["rank"] = rank
            row["reached_seeds"] = sum(bool(v) for v in row["reached"].values())
        if ranked:
            ranked[0]["resolve_seeds"] = seeds_to_resolve(ranked)
        out += ranked
    return out
