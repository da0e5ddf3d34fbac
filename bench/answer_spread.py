"""How far does one answer move between grids? Each row's held-out mean over several finished
grids (each with its own sampler and held-out seeds, on one dataset), against that mean's own
noise.

A row (network, model, algorithm) of a grid's answer is a mean over its held-out seeds. Over
``--run-dirs`` (two or more grids), this prints, per row, each grid's mean (``*``: in that
grid's tied-best set), the coefficient of variation of those means between the grids, and the
mean of their relative standard errors within each grid (the held-out seeds' own noise:
standard deviation over the seeds / sqrt(seeds) / mean). A row whose grids differ by more than
twice that error moved because its searches answered with other configurations, not because
of the held-out seeds. The summary is over the rows other than the baseline's (``geodamplr``,
searched once per model: one search sets every speedup of its grid, printed apart).

No goal of its own: it tells which part of ``bench/answer_stability.py``'s disagreements the
held-out seeds could remove (issue 24). Run: ``python bench/answer_spread.py --run-dirs
A,B,C``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from answer_stability import BASELINE, Answer, answer_of  # noqa: E402


def relative_se(row: dict[str, Any]) -> float | None:
    """The relative standard error of a row's held-out mean; None with fewer than two seeds."""
    values = list(row["values"].values())
    if len(values) < 2 or not row["mean"]:
        return None
    return float(statistics.stdev(values) / len(values) ** 0.5 / row["mean"])


def spread_rows(answers: list[Answer]) -> list[dict[str, Any]]:
    """Per (network, model, algorithm) found in every grid: the grids' means and tied-best
    marks, the CV between the grids and the mean within-grid relative SE."""
    rows = []
    for pair in sorted(set.intersection(*(set(a) for a in answers))):
        algorithms = set.intersection(*({r["algorithm"] for r in a[pair]} for a in answers))
        for algorithm in sorted(algorithms):
            found = [next(r for r in a[pair] if r["algorithm"] == algorithm) for a in answers]
            means = [float(r["mean"]) for r in found]
            errors = [e for e in (relative_se(r) for r in found) if e is not None]
            rows.append({"network": pair[0], "model": pair[1], "algorithm": algorithm,
                         "means": means, "tied": [bool(r["tied_best"]) for r in found],
                         "params": [r["params"] for r in found],
                         "cv": statistics.stdev(means) / statistics.fmean(means),
                         "se": statistics.fmean(errors) if errors else None})
    return rows


def _line(row: dict[str, Any]) -> str:
    means = "  ".join(f"{m:.3f}{'*' if t else ' '}" for m, t in zip(row["means"], row["tied"],
                                                                  strict=True))
    se = "n/a" if row["se"] is None else f"{row['se']:.1%}"
    params = " | ".join(str({k: round(v, 3) if isinstance(v, float) else v
                             for k, v in (p or {}).items()}) for p in row["params"])
    return (f"n{row['network']} {row['model']} {row['algorithm']:16s} {means}  "
            f"CV {row['cv']:.1%}  SE {se}  {params}")


def summary(rows: list[dict[str, Any]]) -> str:
    """The rows other than the baseline's: median and max CV between the grids, median
    within-grid SE, and how many rows moved by more than twice their SE."""
    rest = [r for r in rows if r["algorithm"] != BASELINE and r["se"] is not None]
    if not rest:
        return "no row other than the baseline's has two or more held-out seeds"
    cvs, ses = [r["cv"] for r in rest], [r["se"] for r in rest]
    beyond = sum(r["cv"] > 2 * r["se"] for r in rest)
    return (f"rows other than {BASELINE}'s: {len(rest)}; CV of a row's mean between the grids: "
            f"median {statistics.median(cvs):.1%}, max {max(cvs):.1%}; within-grid relative SE "
            f"of a mean: median {statistics.median(ses):.1%}; rows whose CV exceeds twice "
            f"their SE: {beyond} of {len(rest)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dirs", required=True,
                        help="two or more finished grids' run directories, comma-separated")
    args = parser.parse_args(argv)
    dirs = [d for d in args.run_dirs.split(",") if d]
    if len(dirs) < 2:
        parser.error(f"--run-dirs: got {args.run_dirs!r}; expected two or more run "
                     "directories, comma-separated")
    rows = spread_rows([answer_of(d) for d in dirs])
    print(f"grids: {', '.join(dirs)}")
    for row in rows:
        print(_line(row))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
