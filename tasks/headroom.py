"""How much the grid's cost model lets damping win: the ceiling of each (network, model) pair.

From the baseline's own trajectory (:mod:`damptune.ceiling`): ``s``, the per-epoch speedup at
the cap on a network profile; ``φ``, the share of the baseline's time to target (under the
budget objective: of its epoch budget) after the point where a damper could first grow: where
the baseline's own damping first passes B0 (its first learning-rate decay; a damper that grows
the batch by the same factor grows it there); and the Amdahl ceiling
``1 / ((1 − φ) + φ / s)`` on any damped speedup, per profile. (The earliest growth of any
searched configuration, used before, made φ 1 whenever a configuration started above B0.)
Printed in the report beside the speedups measured, so a user sees whether the algorithms or
the cost model set the answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from damptune.ceiling import ceiling, epoch_speedup, first_damping, growth_share
from damptune.checkpoint import load_checkpoint
from damptune.config import TrainConfig
from damptune.errors import DamptuneError
from tasks.answer import BASELINE, n_params_of
from tasks.grid import Cell, GridSettings, checkpoint_path
from tasks.objective import judge, objective_of

__all__ = ["headroom_rows", "headroom_markdown"]


def _checkpoint(grid: GridSettings, cell: Cell, number: int) -> dict[str, Any] | None:
    try:
        return load_checkpoint(checkpoint_path(grid, cell, number))
    except (DamptuneError, OSError, KeyError, ValueError):
        return None


def _pair(grid: GridSettings, baseline: dict[str, Any], *, network: int,
          profiles: tuple[str | None, ...]) -> list[dict[str, Any]]:
    """The pair's row on each of ``profiles`` (None: the grid's own); the checkpoints are read
    once, whatever the number of profiles. The target and the objective are the baseline's
    study's: under the budget objective, ``φ`` is a share of the baseline's whole budget and a
    configuration reached the target when its final accuracy did."""
    base_cell = Cell(int(baseline.get("searched_network", baseline["network"])), BASELINE,
                     str(baseline["model"]))
    if baseline.get("best_trial") is None or baseline.get("target_accuracy") is None:
        return []
    ckpt = _checkpoint(grid, base_cell, int(baseline["best_trial"]))
    if ckpt is None:
        return []
    own = TrainConfig.from_dict(ckpt["config"])
    target, n_params = float(baseline["target_accuracy"]), n_params_of(ckpt)
    kind = objective_of(baseline)
    met = judge(target=target, kind=kind, n_train=own.n_train)
    b0 = int(own.damper_kwargs.get("initial", own.per_worker_batch))
    grew = first_damping(ckpt["history"], initial_batch=b0)
    # the growth φ is measured from: none when the baseline itself did not meet the objective
    start = grew if grew is not None and met(ckpt["history"]).reached else None
    rows = []
    names = list(dict.fromkeys(own.profile if p is None else p for p in profiles))
    for profile in names:  # the same run costed on another network (its overrides kept)
        config = own if profile == own.profile else dataclasses.replace(own, profile=profile)
        cost = config.cost_model(n_params)
        s = epoch_speedup(cost, examples=int(config.n_train), initial_batch=b0,
                          per_worker_batch=int(config.per_worker_batch), n_ranks=network)
        phi = (growth_share(ckpt["history"], cost, growth_examples=start,
                            target=None if kind == "budget" else target)
               if start is not None else None)
        rows.append({"network": network, "model": baseline["model"],
                     "profile": config.profile, "s": s, "phi": phi, "growth_examples": grew,
                     "ceiling": ceiling(s=s, phi=phi) if phi is not None else None})
    return rows


def headroom_rows(cells: list[dict[str, Any]], *, grid: GridSettings, storage: str = "",
                  profiles: tuple[str | None, ...] = (None,)) -> list[dict[str, Any]]:
    """One row per (network, model) of the report's ``cells`` (with shared rows) that has a
    baseline checkpoint, and per profile: ``profile``, ``s``, ``phi``, ``growth_examples`` and
    ``ceiling``, on the grid's own profile (None) or on the named ``profiles`` (what the same
    trials would allow on another network)."""
    out = []
    for network, model in sorted({(int(c["network"]), str(c["model"])) for c in cells}):
        here = [c for c in cells if (int(c["network"]), c["model"]) == (network, model)]
        baseline = next((c for c in here if c["algorithm"] == BASELINE), None)
        if baseline:
            out += _pair(grid, baseline, network=network, profiles=profiles)
    return out


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def headroom_markdown(rows: list[dict[str, Any]],
                      measured: dict[tuple[int, str], float] | None = None) -> str:
    """The ceiling table, with the best damped speedup measured beside it when given."""
    measured = measured or {}
    lines = ["| model | network | profile | s (epoch at cap vs B0) | φ (share after the "
             "baseline's first decay) | ceiling | best damped speedup measured |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["network"])):
        lines.append(f"| {r['model']} | {r['network']} | {r['profile']} | {_num(r['s'], '.2f')} "
                     f"| {_num(r['phi'], '.2f')} | {_num(r['ceiling'], '.2f')}× | "
                     f"{_num(measured.get((r['network'], r['model'])), '.2f')} |")
    return "\n".join(lines) + "\n"
