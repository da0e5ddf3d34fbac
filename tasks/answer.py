"""The grid's answer, from plain data: for each (network size, model), the algorithms ranked by
their best simulated time to the target accuracy, with the speedup over ``geodamplr``.

Pure functions over the summary rows of the cells (``tasks.search.summarize``, plus the study's
``target_accuracy``) and over a trial's checkpoint dict (its ``history``, ``config`` and
``model``): nothing here reads a file or a store.
"""

from __future__ import annotations

import math
from typing import Any

from damptune import TrainConfig
from damptune.dampers import DAMPERS
from damptune.netmodel import (
    REPLAY_PROFILES,
    CostModel,
    Network,
    simulated_times,
    time_to_target,
)
from tasks.grid import never_grows
from tasks.objective import judge
from tasks.stats import RESOLVE_CAP
from tasks.validation import HELD_OUT_EPOCHS, MATCHED_SUFFIX

__all__ = ["BASELINE", "RANK_COLUMNS", "answer_markdown", "progress_to_target", "eval_curve",
           "rank_cells", "replay_on_profiles", "profile_costs", "mechanism_sentence",
           "ranking_markdown", "profiles_markdown", "n_params_of"]

BASELINE = "geodamplr"  # plain SGD with a step learning-rate decay: the AdaDamp paper's baseline
RANK_COLUMNS = ("grid", "network", "model", "rank", "algorithm", "best_value",
                "speedup_vs_geodamplr", "reached", "updates_to_target", "epochs_to_target",
                "examples_to_target", "best_trial", "best_params", "target_accuracy", "profile",
                "n_complete", "n_pruned", "n_failed", "n_interrupted", "study", "history",
                "shared_from")


def progress_to_target(history: list[dict[str, Any]], *, target: float) -> dict[str, Any]:
    """Where a run first reached ``target``: the first evaluation with ``test_accuracy >=
    target`` gives its model updates, epochs, examples seen and simulated seconds; all None and
    ``reached`` False when no evaluation did."""
    hit = next((r for r in history if r.get("kind") == "eval"
                and r["test_accuracy"] >= target), None)
    if hit is None:
        return {"reached": False, "updates_to_target": None, "epochs_to_target": None,
                "examples_to_target": None, "time_sim_to_target": None}
    return {"reached": True, "updates_to_target": int(hit["update"]),
            "epochs_to_target": float(hit["epoch"]),
            "examples_to_target": int(hit["examples_seen"]),
            "time_sim_to_target": float(hit["time_sim"])}


def eval_curve(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The run's evaluations: test accuracy with its updates, epochs and simulated seconds."""
    return [{"update": r["update"], "epoch": r["epoch"], "time_sim": r["time_sim"],
             "test_accuracy": r["test_accuracy"]} for r in history if r.get("kind") == "eval"]


def _sort_key(row: dict[str, Any]) -> tuple[bool, bool, float, str]:
    value = row.get("best_value")
    return (value is None, row.get("reached") is False,
            math.inf if value is None else float(value), str(row["algorithm"]))


def rank_cells(cells: list[dict[str, Any]], *, baseline: str = BASELINE) -> list[dict[str, Any]]:
    """Rank the algorithms of each (network, model) pair: those whose best trial reached the
    target first, by best value (least first), then those whose best did not.

    Each cell is a dict with ``network``, ``model``, ``algorithm``, ``best_value`` (None when
    the cell has no COMPLETE trial) and ``reached`` (False: the best trial missed the target;
    None: unknown); the result is a copy of each with ``rank`` (1 for the fastest; None without
    a value) and ``speedup_vs_geodamplr``: the baseline's best value over this one's in the
    same pair (None when either is missing or missed the target: a time to the target is
    compared only with another). Sorted by network, model, rank.
    """
    pairs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for cell in cells:
        pairs.setdefault((int(cell["network"]), str(cell["model"])), []).append(dict(cell))
    out: list[dict[str, Any]] = []
    for key in sorted(pairs):
        group = sorted(pairs[key], key=_sort_key)
        base = next((c["best_value"] for c in group
                     if c["algorithm"] == baseline and c.get("reached") is not False), None)
        for position, cell in enumerate(group, start=1):
            value = cell.get("best_value")
            cell["rank"] = position if value is not None else None
            cell["speedup_vs_geodamplr"] = (
                float(base) / float(value)
                if base is not None and value and cell.get("reached") is not False else None)
            out.append(cell)
    return out


def n_params_of(ckpt: dict[str, Any]) -> int:
    """Parameters of the checkpoint's model: the elements of its floating-point tensors."""
    return sum(int(t.numel()) for t in ckpt["model"].values() if t.is_floating_point())


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else float(seconds) * 1e3


def profile_costs(config: TrainConfig, n_params: int, *,
                  profiles: dict[str, Network] | None = None) -> dict[str, CostModel]:
    """The run's cost model (its compute calibration, ``n_params`` parameters) on every
    network profile (default: the named ones), with the run's overhead override (seconds per
    update, in its configuration) in place of each profile's when it has one."""
    cost = config.cost_model(n_params)
    return {name: cost.with_network(network.with_overhead(_ms(config.overhead),
                                                          _ms(config.overhead_per_rank)))
            for name, network in (profiles or REPLAY_PROFILES).items()}


def replay_on_profiles(ckpt: dict[str, Any], *, target: float, objective: str = "target",
                       profiles: dict[str, Network] | None = None) -> list[dict[str, Any]]:
    """The run's value on every network profile (default: the named ones): its time to
    ``target``, or with ``objective`` "budget" the time of its whole history when its final
    accuracy reached ``target`` (:func:`tasks.objective.outcome`; the same on every profile).

    The run's history is replayed through its own cost model (compute calibration, model size,
    damper's work) on each profile's network, with the run's overhead override when its
    configuration has one. One dict per profile: ``profile``, ``reached``, ``seconds``
    (None when not reached) and ``updates``.
    """
    config = TrainConfig.from_dict(ckpt["config"])
    norm = bool(config.make_damper().uses_grad_norm)
    history = ckpt["history"]
    budget = objective == "budget" and judge(target=target, kind=objective,
                                             n_train=config.n_train)(history).reached
    last = next((int(r["update"]) for r in reversed(history) if r["kind"] == "update"), None)
    rows = []
    for name, net in profile_costs(config, n_params_of(ckpt), profiles=profiles).items():
        if objective == "budget":
            seconds = simulated_times(history, net, norm=norm)[-1] if budget else None
            rows.append({"profile": name, "reached": budget, "seconds": seconds,
                         "updates": last})
            continue
        ttt = time_to_target(history, net, target=target, norm=norm)
        rows.append({"profile": name, "reached": ttt.reached,
                     "seconds": ttt.simulated_seconds if ttt.reached else None,
                     "updates": ttt.update})
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items()) or "–"
    return str(value)


def ranking_markdown(rows: list[dict[str, Any]]) -> str:
    """One Markdown table per (network, model) pair, its algorithms in rank order."""
    columns = ("rank", "algorithm", "best_value", "speedup_vs_geodamplr", "reached",
               "updates_to_target", "epochs_to_target", "best_trial", "best_params",
               "n_complete", "n_pruned", "n_failed", "n_interrupted", "history")
    heads = ("rank", "algorithm", "best (simulated s)", f"speedup vs {BASELINE}", "reached",
             "updates to target", "epochs to target", "trial", "best hyperparameters",
             "complete", "pruned", "failed", "interrupted", "history")
    parts: list[str] = []
    pair = None
    for row in rows:
        if (row["network"], row["model"]) != pair:
            pair = (row["network"], row["model"])
            parts += [f"\n### {row['model']} on {row['network']} ranks (search target "
                      f"{_cell(row.get('target_accuracy'))})\n",
                      "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        speedup = row.get("speedup_vs_geodamplr")
        parts.append("| " + " | ".join(
            f"{speedup:.2f}×" if c == "speedup_vs_geodamplr" and speedup is not None
            else _cell(row.get(c)) for c in columns) + " |")
    return "\n".join(parts).lstrip("\n") + "\n"


def profiles_markdown(rows: list[dict[str, Any]]) -> str:
    """The profile replay as one Markdown table: seconds to the target per profile."""
    names = list(dict.fromkeys(r["profile"] for r in rows))
    keyed: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in rows:
        keyed.setdefault((r["network"], r["model"], r["algorithm"]), {})[r["profile"]] = r
    lines = ["| network | model | algorithm | " + " | ".join(f"{n} (s)" for n in names) + " |",
             "|" + "---|" * (3 + len(names))]
    for (network, model, algorithm), by in keyed.items():
        cells = [_cell(by[n]["seconds"]) if by.get(n, {}).get("reached") else "not reached"
                 for n in names]
        lines.append(f"| {network} | {model} | {algorithm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _interval(low: float | None, mid: float | None, high: float | None) -> str:
    if mid is None:
        return "–"
    return f"{mid:.2f}× [{low:.2f}, {high:.2f}]" if low is not None else f"{mid:.2f}×"


def answer_markdown(rows: list[dict[str, Any]], *, profile: str | None = None) -> str:
    """The answer per (network, model): each algorithm's mean simulated time over the held-out
    seeds (95 % CI), its paired speedup over the baseline, and the tied-best set, with a
    sentence saying which algorithms the data cannot tell apart, and one saying how the best
    damped algorithm won (:func:`mechanism_sentence`, on ``profile``: default the one the
    rows' trials were simulated on)."""
    parts: list[str] = []
    pair = None
    heads = ("rank", "algorithm", "mean s ± 95 % CI", "seeds (reached)",
             f"speedup vs {BASELINE} [95 % CI]", "updates × [CI]", "epochs × [CI]",
             "tied best", "configuration")
    for row in rows:
        if (row["network"], row["model"]) != pair:
            pair = (row["network"], row["model"])
            in_pair = [r for r in rows if (r["network"], r["model"]) == pair]
            parts += [f"\n### {row['model']} on {row['network']} ranks\n",
                      _verdict(in_pair) + _unchanged(in_pair) + "\n",
                      *_paragraph(mechanism_sentence(in_pair, profile=profile)),
                "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        ci = "" if row["ci"] is None else f" ± {row['ci']:.3g}"
        parts.append("| " + " | ".join((
            str(row["rank"]), row["algorithm"], f"{row['mean']:.4g}{ci}",
            f"{row['n_seeds']} ({row['reached_seeds']})",
            _interval(row["speedup_low"], row["speedup"], row["speedup_high"]),
            _interval(*(row.get(f"updates_ratio{x}") for x in ("_low", "", "_high"))),
            _interval(*(row.get(f"epochs_ratio{x}") for x in ("_low", "", "_high"))),
            "yes" if row["tied_best"] else "no" if row["reliable"] else "no: missed the target "
            "on most seeds", _cell(row["params"]) + _replaced(row))) + " |")
    return (_near_misses(rows) + "\n".join(parts)).lstrip("\n") + "\n"


def _paragraph(text: str) -> list[str]:
    return [text + "\n"] if text else []


def mechanism_sentence(rows: list[dict[str, Any]], *, profile: str | None = None) -> str:
    """How the best reliable damped row of a (network, model) pair's answer rows
    (:func:`tasks.stats.compare_pair`, ranked) beat the baseline: X× fewer model updates
    (1 / ``updates_ratio``) at Y× the epochs (``epochs_ratio``), and Z× less simulated
    wall-clock on ``profile`` (its ``profile_speedups``; default the profile the trials were
    simulated on), each with its 95 % interval. "" for a pair without damped rows, or whose
    trials did not record their mechanism (a grid from before it was)."""
    damped = [r for r in rows if not never_grows(str(r["algorithm"]))]
    if not damped or not any(r.get("mechanism") for r in rows):
        return ""
    best = next((r for r in damped if r["reliable"]), None)
    if best is None:
        return ("Mechanism: no damped algorithm reached the target on most held-out seeds, "
                "so none shows fewer updates to it.")
    if best.get("updates_ratio") is None:
        return (f"Mechanism: damping ({best['algorithm']}) and {BASELINE} reached the target "
                "on no common held-out seed with their updates recorded: no paired "
                "comparison of updates.")
    low, mid, high = best["updates_ratio_low"], best["updates_ratio"], best["updates_ratio_high"]
    fewer = _interval(None if high is None else 1 / high, 1 / mid,
                      None if low is None else 1 / low)
    epochs = _interval(best["epochs_ratio_low"], best["epochs_ratio"],
                       best["epochs_ratio_high"])
    name = profile or _trained_profile(rows)
    speedup = (best.get("profile_speedups") or {}).get(name) if name else None
    time = (f"on profile {name} that is {_interval(*speedup)} less wall-clock time"
            if speedup else f"no paired time on profile {name or '(unknown)'}")
    return (f"Mechanism: damping ({best['algorithm']}) reached the target in {fewer} fewer "
            f"updates at {epochs} the epochs; {time}.")


def _trained_profile(rows: list[dict[str, Any]]) -> str | None:
    """The network profile the rows' trials were simulated on (their mechanisms say)."""
    return next((str(m["profile"]) for r in rows for m in (r.get("mechanism") or {}).values()
                 if m and m.get("profile")), None)


def _near_misses(rows: list[dict[str, Any]]) -> str:
    """A paragraph per model whose answers include configurations that missed the search's
    target on its one seed by running out of the search's epochs (``search_shortfall`` > 0:
    mostly near misses retrained beside their search's best, :mod:`tasks.validation`; or a
    best of a search in which no trial reached the target), and reached
    the target on the held-out seeds, which train longer: the search's epoch budget is where
    the fastest configurations were cut off."""
    out = []
    for model in sorted({r["model"] for r in rows}):
        own = [r for r in rows if r["model"] == model
               and not r["algorithm"].endswith(MATCHED_SUFFIX)]
        near = [r for r in own if (r.get("search_shortfall") or 0) > 0 and r["reliable"]]
        if not near:
            continue
        short = [f"{v:.3g}" for v in sorted(r["search_shortfall"] for r in near)]
        span = "–".join(dict.fromkeys((short[0], short[-1])))
        cells = ", ".join(f"n{r['network']} {r['algorithm']}" for r in near)
        head = (f"**{model}: {len(near)} of {len(own)} answers missed the search's target on "
                f"its seed** ({cells}): ")
        if all(r.get("objective") == "budget" for r in near):  # held-out: the same budget
            out.append(head + f"their final accuracy fell {span} short of it (the target plus "
                       "`search_margin`), and reached the target on most held-out seeds, "
                       "which train the same budget.\n")
            continue
        out.append(
            head + f"they ran out of the search's epochs {span} short of it, and reached the "
            f"target on most held-out seeds, whose budget is {HELD_OUT_EPOCHS:g}× the search's "
            "epochs. These answers needed more epochs than the search gives on its seed; a "
            f"larger `epochs` for {model} lets the search judge such configurations itself (a "
            "trial stops at its target, so only the trials that miss it train longer).\n")
    return "\n".join(out)


def _replaced(row: dict[str, Any]) -> str:
    """What the selection chose it over: the search's best (and candidates before it) that
    reached the target on fewer selection seeds, or took longer (:mod:`tasks.validation`)."""
    return "".join(f" (replaces {r['validates']}: the target on {r['reached_seeds']} of "
                   f"{r['n_seeds']} selection seeds{_mean_of(r)})"
                   for r in row.get("replaced") or [])


def _mean_of(replaced: dict[str, Any]) -> str:
    mean = replaced.get("mean")
    return "" if mean is None else f", mean {mean:.4g} s"


def _unchanged(rows: list[dict[str, Any]]) -> str:
    """A sentence per algorithm whose answer stopped (at the target, or at the end of its
    budget) before its schedule changed the batch size or learning rate, on most of its
    held-out seeds: there it was plain SGD. For the baseline that qualifies every speedup of
    the pair. (A matched row shares the baseline's schedule: its sentence would repeat the
    baseline's; a damper with nothing to search, ``sgd``, has no schedule.)"""
    notes = []
    for r in rows:
        n, same = r["n_seeds"], r.get("unchanged_seeds")
        if (same is None or 2 * same <= n or r["algorithm"].endswith(MATCHED_SUFFIX)
                or _without_schedule(r["algorithm"])):
            continue
        notes.append(f" {r['algorithm']}'s configuration ({_cell(r['params'])}) stopped before "
                     f"its schedule changed the batch size or learning rate on {same} of {n} "
                     "held-out seeds: there it trained as plain SGD.")
        if r["algorithm"] == BASELINE:
            notes.append(" The speedups of this pair are over that: the baseline's search "
                         "found no decay that acts before the target.")
    return "".join(notes)


def _without_schedule(algorithm: str) -> bool:
    damper = DAMPERS.get(algorithm)
    return damper is not None and not damper.search_space


def _verdict(rows: list[dict[str, Any]]) -> str:
    tied = [r["algorithm"] for r in rows if r["tied_best"]]
    if not tied:
        return "No algorithm reached the target on most held-out seeds."
    if len(tied) == 1:
        return (f"**{tied[0]}** is the fastest: every other algorithm is significantly "
                "slower (95 %, family-wise).")
    return (f"**Indistinguishable** at 95 % (family-wise over the comparisons with the best): "
            f"{', '.join(tied)} (the tied-best set; "
            f"{tied[0]} has the least mean).{_resolve_hint(rows[0].get('resolve_seeds'))}")


def _resolve_hint(more: int | None) -> str:
    """What more seeds would do for a tie (``more``: :func:`tasks.stats.seeds_to_resolve`)."""
    if not more:
        return (" More trials per cell (a better best configuration) or more seeds may tell "
                "them apart.")
    if more > RESOLVE_CAP:
        return (f" Not even {RESOLVE_CAP:,} held-out seeds would tell the two best apart at "
                "this spread: they are as fast as each other.")
    return f" About {more} held-out seeds would tell the two best apart at this spread."
