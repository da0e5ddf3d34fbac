"""How much can damping speed training up at most, by the cost model, per network size and
named profile?

For a finished grid's run directory (default ``runs/grid``, what ``make run`` writes), the
same trials are costed on each named network profile (:mod:`tasks.headroom`,
:mod:`damptune.ceiling`): ``s`` (an epoch at the cap on P ranks against an epoch at B0 on one
rank), ``φ`` (the share of the baseline's time to the target after the earliest growth of any
searched configuration that reached it) and the ceiling ``1 / ((1 − φ) + φ / s)``; with the
best damped speedup the grid's held-out seeds measured beside the grid's own profile.

Goal (issue 24): the default profile's ceiling is >= 3x at the largest network (n16) for
every model. The baseline of the ratio is the AdaDamp paper's profile, costed on the same
trials in the same run.

Run: ``python bench/cost_ceiling.py [--run-dir runs/grid]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import records  # noqa: E402

GOAL = 3.0
PAPER = "decentralized-moderate"


def main(argv: list[str] | None = None) -> int:
    from damptune.netmodel import DEFAULT_PROFILE, REPLAY_PROFILES
    from tasks.grid import GridSettings, share_rows
    from tasks.headroom import headroom_rows
    from tasks.report import grid_rows

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", default="runs/grid", help="a finished grid's run directory")
    args = ap.parse_args(argv)
    run_dir = os.path.abspath(args.run_dir)
    with open(os.path.join(run_dir, "grid.json")) as f:
        meta = json.load(f)
    name, storage = meta["grid_name"], f"sqlite:///{run_dir}/optuna.db"
    grid = GridSettings(grid_name=name, run_dir=run_dir,
                        checkpoint_root=meta.get("checkpoint_root") or "")
    cells = share_rows(grid_rows(storage, grid_name=name))
    by_profile: dict[str, list[dict]] = {p: [] for p in REPLAY_PROFILES}
    for row in headroom_rows(cells, grid=grid, storage=storage,
                             profiles=tuple(REPLAY_PROFILES)):
        by_profile[row["profile"]].append(row)  # each checkpoint read once for all profiles
    print(f"grid {name!r} in {run_dir}: ceiling 1/((1-phi)+phi/s) of a damped speedup")
    print(f"{'profile':<24}{'model':<6}{'n':>4}{'s':>8}{'phi':>7}{'ceiling':>9}")
    for profile, rows in by_profile.items():
        for r in rows:
            phi = "-" if r["phi"] is None else f"{r['phi']:.2f}"
            ceil = "-" if r["ceiling"] is None else f"{r['ceiling']:.2f}x"
            print(f"{profile:<24}{r['model']:<6}{r['network']:>4}{r['s']:>8.2f}{phi:>7}{ceil:>9}")
    return _verdict(by_profile, default=DEFAULT_PROFILE, grid=name)


def _verdict(by_profile: dict[str, list[dict]], *, default: str, grid: str) -> int:
    largest = max((r["network"] for r in by_profile[default]), default=None)
    if largest is None:
        print("no baseline checkpoint in the run directory: nothing to judge")
        return 1
    figures: dict[str, float | None] = {}
    goals: dict[str, bool | None] = {}
    for model in sorted({r["model"] for r in by_profile[default]}):
        ours = next(r for r in by_profile[default]
                    if (r["network"], r["model"]) == (largest, model))
        paper = next(r for r in by_profile[PAPER]
                     if (r["network"], r["model"]) == (largest, model))
        ratio = (ours["ceiling"] or 0) / (paper["ceiling"] or float("inf"))
        print(f"{model} n{largest}: ceiling {ours['ceiling'] or 0:.2f}x on {default} "
              f"({ratio:.2f}x the paper profile's {paper['ceiling'] or 0:.2f}x); goal >= "
              f"{GOAL:g}x: {'met' if (ours['ceiling'] or 0) >= GOAL else 'not met'}")
        figures[f"{model}_n{largest}_ceiling"] = ours["ceiling"]
        figures[f"{model}_n{largest}_paper_ceiling"] = paper["ceiling"]
        goals[f"{model}: the default profile's ceiling >= {GOAL:g}x at the largest network"] = (
            (ours["ceiling"] or 0) >= GOAL)
    records.write("cost_ceiling", figures=figures, goals=goals, profile=default, grid=grid)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
