"""The report's figures (matplotlib, Agg), drawn from the plain data of
:func:`tasks.report.build_report`: one PNG each, one panel per model.

* ``time_vs_network.png``: best simulated time to the target against network size, one line
  per algorithm; a cell whose best trial missed the target is marked with a cross.
* ``accuracy_vs_time.png``, ``accuracy_vs_updates.png``, ``accuracy_vs_epochs.png``: test
  accuracy of each algorithm's best trial at the largest network, against simulated time,
  model updates and epochs, with the target as a dashed line.
* ``profiles.png``: each algorithm's best trial at the largest network replayed on every named
  network profile (grouped bars; "n/r" where it does not reach the target on that profile).
* ``speedup_vs_ratio.png`` (when the answer's trials recorded their mechanism): each damped
  algorithm's paired speedup over the baseline on every profile, against that profile's
  compute : communication ratio (:func:`speedup_vs_ratio`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tasks.answer import BASELINE
from tasks.grid import ALGORITHMS, never_grows
from tasks.objective import value_name

__all__ = ["draw_figures", "FIGURES", "MECHANISM_FIGURE", "speedup_vs_ratio"]

FIGURES = ("time_vs_network.png", "accuracy_vs_time.png", "accuracy_vs_updates.png",
           "accuracy_vs_epochs.png", "profiles.png")
MECHANISM_FIGURE = "speedup_vs_ratio.png"  # drawn when the answer's rows have profile speedups
CURVE_AXES = {"accuracy_vs_time.png": ("time_sim", "simulated wall-clock (s)"),
              "accuracy_vs_updates.png": ("update", "model updates"),
              "accuracy_vs_epochs.png": ("epoch", "epochs")}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(algorithm: str, algorithms: list[str]) -> Any:
    """One colour per algorithm, the same in every figure (tab10, the grid's order first)."""
    order = list(ALGORITHMS) + [a for a in algorithms if a not in ALGORITHMS]
    return _pyplot().get_cmap("tab10")(order.index(algorithm) % 10)


def _models(report: dict[str, Any]) -> list[str]:
    return sorted({str(r["model"]) for r in report["ranking"]})


def _algorithms(report: dict[str, Any]) -> list[str]:
    names = {str(r["algorithm"]) for r in report["ranking"]}
    return [a for a in ALGORITHMS if a in names] + sorted(names - set(ALGORITHMS))


def _targets(report: dict[str, Any]) -> dict[str, float | None]:
    return {str(r["model"]): r.get("target_accuracy") for r in report["ranking"]}


def _panels(plt: Any, n: int, *, height: float = 4.0) -> tuple[Any, list[Any]]:
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n + 0.6, height), dpi=110, squeeze=False)
    return fig, list(axes[0])


def _finish(fig: Any, handles: list[Any]) -> Any:
    """A legend below the panels (as many columns as fit the figure's width, about 2 inches
    each), the layout tightened around it."""
    ncol = max(1, min(len(handles), int(fig.get_figwidth() // 2.0)))
    rows = -(-len(handles) // ncol)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.07 * rows + 0.02, 1, 1))
    return fig


MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h")


def _style(algorithm: str, algorithms: list[str]) -> dict[str, Any]:
    """Colour and marker of an algorithm's line (overlapping lines stay visible)."""
    return {"color": _color(algorithm, algorithms),
            "marker": MARKERS[algorithms.index(algorithm) % len(MARKERS)]}


def _axis_scale(ax: Any, values: list[float]) -> None:
    """Log scale when the values span more than a decade, linear (with labels) otherwise."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) > 10 * min(positive):
        ax.set_yscale("log")


def time_vs_network(report: dict[str, Any]) -> Any:
    """Best simulated time to the target against network size (the headline): a Figure whose
    panels (one per model) hold one line per algorithm, labelled with its name."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    models, algorithms, targets = _models(report), _algorithms(report), _targets(report)
    fig, axes = _panels(plt, len(models))
    networks = sorted({int(r["network"]) for r in report["ranking"]})
    for ax, model in zip(axes, models, strict=True):
        valued = [r for r in report["ranking"] if r["model"] == model
                  and r["best_value"] is not None]
        for algorithm in algorithms:
            cells = sorted((r for r in valued if r["algorithm"] == algorithm),
                           key=lambda r: r["network"])
            style = _style(algorithm, algorithms)
            ax.plot([c["network"] for c in cells], [c["best_value"] for c in cells],
                    markersize=6, alpha=0.9, label=algorithm, **style)
            dodge = 2 ** (0.05 * (algorithms.index(algorithm) - (len(algorithms) - 1) / 2))
            _held_out(ax, report, model, algorithm, style["color"], dodge=dodge)
            missed = [c for c in cells if c.get("reached") is False]
            ax.scatter([c["network"] for c in missed], [c["best_value"] for c in missed],
                       marker="X", s=130, color=style["color"], edgecolors="black", zorder=3,
                       label=f"{algorithm}: missed the target")
        ax.set_xscale("log", base=2)
        ax.set_xticks(networks, [str(n) for n in networks])
        ax.xaxis.set_minor_locator(NullLocator())
        _axis_scale(ax, [float(r["best_value"]) for r in valued])
        ax.set_xlabel("network size (ranks)")
        ax.set_ylabel(f"{value_name(report['ranking'])} (s)")
        ax.set_title(f"{model}: target accuracy {targets.get(model)}")
        ax.grid(alpha=0.3, which="both")
    handles = [Line2D([], [], label=a, **_style(a, algorithms)) for a in algorithms]
    if any(r.get("reached") is False for r in report["ranking"]):
        handles.append(Line2D([], [], color="grey", marker="X", markeredgecolor="black",
                              linestyle="", markersize=9, label="best trial missed the target"))
    if report.get("answer"):
        handles.append(Line2D([], [], color="grey", marker="o", markerfacecolor="white",
                              label="mean over held-out seeds, 95 % CI"))
    if any(r.get("replaced") for r in report.get("answer", [])):
        handles.append(Line2D([], [], color="grey", marker="s", markerfacecolor="white",
                              linestyle="", label="another configuration than the search's best"))
    if any(r.get("reliable") is False for r in report.get("answer", [])):
        handles.append(Line2D([], [], color="grey", marker="x", linestyle="",
                              label="missed the target on most held-out seeds"))
    name = value_name(report["ranking"])
    fig.suptitle(f"{name[0].upper()}{name[1:]}, per network size: the search's best "
                 "trial (lines), the answer's configuration on the held-out seeds (bars)"
                 if report.get("answer") else f"Least {name}, per network size")
    return _finish(fig, handles)


def _held_out(ax: Any, report: dict[str, Any], model: str, algorithm: str, color: Any, *,
              dodge: float = 1.0) -> None:
    """The cell's mean over the held-out seeds with its 95 % interval, as an error bar, moved
    right or left by the factor ``dodge`` so that the algorithms' bars do not hide each
    other. A circle for the search's best, a square for another configuration (a runner-up: the
    best missed; or a faster near miss), an x for a configuration
    that missed the target on most seeds (its mean is no time to the target)."""
    rows = sorted((r for r in report.get("answer", []) if r["model"] == model
                   and r["algorithm"] == algorithm), key=lambda r: r["network"])
    answers = [r for r in rows if r.get("reliable") is not False]
    for marker, part in (("o", [r for r in answers if not r.get("replaced")]),
                         ("s", [r for r in answers if r.get("replaced")]),
                         ("x", [r for r in rows if r.get("reliable") is False])):
        if part:
            ax.errorbar([r["network"] * dodge for r in part], [r["mean"] for r in part],
                        yerr=[r["ci"] or 0.0 for r in part], fmt=marker, color=color,
                        markerfacecolor="white", capsize=4, linestyle="none", zorder=4)


def _largest(report: dict[str, Any], model: str) -> int | None:
    networks = [int(c["network"]) for c in report["curves"] if c["model"] == model]
    return max(networks) if networks else None


def accuracy_curves(report: dict[str, Any], *, x_key: str, x_label: str) -> Any:
    """Test accuracy of each algorithm's best trial at the largest network against
    ``x_key`` (``time_sim``, ``update`` or ``epoch``), with the target dashed: a Figure, one
    panel per model, one line per algorithm labelled with its name."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    models, algorithms, targets = _models(report), _algorithms(report), _targets(report)
    fig, axes = _panels(plt, len(models))
    for ax, model in zip(axes, models, strict=True):
        largest = _largest(report, model)
        for c in report["curves"]:
            if c["model"] == model and c["network"] == largest and c["curve"]:
                ax.plot([p[x_key] for p in c["curve"]], [p["test_accuracy"] for p in c["curve"]],
                        markersize=3, alpha=0.9, label=c["algorithm"],
                        **_style(c["algorithm"], algorithms))
        target = targets.get(model)
        if target is not None:
            ax.axhline(float(target), color="black", linestyle="--", linewidth=1)
        ax.set_xlabel(x_label)
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{model}, {largest} ranks: best trial of each algorithm"
                     if largest else f"{model}: no history available")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], label=a, **_style(a, algorithms)) for a in algorithms]
    handles.append(Line2D([], [], color="black", linestyle="--", label="target accuracy"))
    return _finish(fig, handles)


def profiles_bars(report: dict[str, Any]) -> Any:
    """Each algorithm's best trial at the largest network, replayed on every profile: a
    Figure, one panel per model, one bar per algorithm and profile (its gid
    ``"<algorithm> on <profile>"``)."""
    plt = _pyplot()
    from matplotlib.patches import Patch
    from matplotlib.transforms import blended_transform_factory as blended

    models, algorithms = _models(report), _algorithms(report)
    names = list(dict.fromkeys(r["profile"] for r in report["profiles"]))
    fig, axes = _panels(plt, len(models), height=4.2)
    width = 0.8 / max(len(names), 1)
    shades = [plt.get_cmap("Set2")(i) for i in range(len(names))]
    for ax, model in zip(axes, models, strict=True):
        rows = [r for r in report["profiles"] if r["model"] == model]
        largest = max((int(r["network"]) for r in rows), default=None)
        for i, algorithm in enumerate(algorithms):
            for j, name in enumerate(names):
                hit = next((r for r in rows if r["network"] == largest
                            and r["algorithm"] == algorithm and r["profile"] == name), None)
                x = i + (j - (len(names) - 1) / 2) * width
                if hit is not None and hit["reached"]:
                    ax.bar(x, hit["seconds"], width, color=shades[j], edgecolor="black",
                           linewidth=0.5, gid=f"{algorithm} on {name}")
                elif hit is not None:  # not reached: no bar, a note just above the axis
                    ax.text(x, 0.02, "n/r", transform=blended(ax.transData, ax.transAxes),
                            ha="center", va="bottom", fontsize=8, color="dimgrey")
        ax.set_xticks(range(len(algorithms)), algorithms, rotation=20, ha="right")
        ax.set_ylabel(f"{value_name(report['ranking'])} (s)")
        ax.set_title(f"{model}, {largest} ranks: best trials on each profile"
                     if largest else f"{model}: no history available")
        ax.grid(alpha=0.3, axis="y")
    handles = [Patch(facecolor=shades[j], edgecolor="black", label=n)
               for j, n in enumerate(names)]
    if any(not r["reached"] for r in report["profiles"]):
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label="n/r: target not reached"))
    return _finish(fig, handles)


def speedup_vs_ratio(report: dict[str, Any]) -> Any:
    """Why damping wins where it does: each damped algorithm's speedup over the baseline at
    the largest network of the answer (y, log; the paired geometric mean over the held-out
    seeds with its 95 % interval as an error bar, from its row's ``profile_speedups``) on
    every network profile, placed at that profile's compute : communication ratio (x, log,
    dimensionless; :func:`tasks.mechanism.compute_comm_ratio`: the seconds a rank computes its
    ``per_worker_batch`` examples of an update over the seconds the update's gradients take
    to travel among the network's ranks, orchestration overhead excluded; the median of the
    pair's trials' calibrations). A Figure, one panel per model, one line per damped
    algorithm (labelled with its name); a dashed line at 1 (as fast as the baseline). The
    x ticks name the profiles."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    answer = [r for r in report.get("answer", []) if r.get("profile_speedups")]
    models = sorted({str(r["model"]) for r in answer})
    named = {str(r["algorithm"]) for r in report.get("answer", [])}
    order = [a for a in ALGORITHMS if a in named] + sorted(named - set(ALGORITHMS))
    fig, axes = _panels(plt, max(1, len(models)))
    for ax, model in zip(axes, models, strict=False):
        network = max(int(r["network"]) for r in answer if r["model"] == model)
        _speedup_panel(ax, [r for r in report["answer"] if r["model"] == model
                            and int(r["network"]) == network], order)
        ax.set_title(f"{model}, {network} ranks: speedup on each profile")
    handles = [Line2D([], [], label=a, **_style(a, order))
               for a in sorted({str(r["algorithm"]) for r in answer}, key=order.index)
               if not never_grows(a)]
    handles.append(Line2D([], [], color="black", linestyle="--", label=f"as fast as {BASELINE}"))
    return _finish(fig, handles)


def _merged_ticks(ratios: dict[str, float], within: float = 1.3) -> list[tuple[str, float]]:
    """One x tick per group of profiles whose ratios lie within ``within``× of the group's
    first (their labels would overlap on a log axis): "name, name (ratio)"."""
    groups: list[list[tuple[str, float]]] = []
    for name, ratio in sorted(ratios.items(), key=lambda kv: kv[1]):
        if groups and ratio <= groups[-1][0][1] * within:
            groups[-1].append((name, ratio))
        else:
            groups.append([(name, ratio)])
    return [(", ".join(n for n, _ in g) + f" ({g[0][1]:.3g})", g[0][1]) for g in groups]


def _speedup_panel(ax: Any, pair: list[dict[str, Any]], order: list[str]) -> None:
    """One model's panel of :func:`speedup_vs_ratio`: its damped rows at one network size, an
    x tick per profile (its name and ratio)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

    ratios = _compute_comm(pair)
    for row in pair:
        if never_grows(str(row["algorithm"])) or not row.get("profile_speedups"):
            continue
        points = sorted((ratios[p], *v) for p, v in row["profile_speedups"].items()
                        if ratios.get(p))
        mid = [m for _, _, m, _ in points]
        err = [[m - (lo if lo is not None else m) for _, lo, m, _ in points],
               [(hi if hi is not None else m) - m for _, _, m, hi in points]]
        ax.errorbar([x for x, *_ in points], mid, yerr=err, capsize=4, alpha=0.9,
                    label=row["algorithm"], **_style(str(row["algorithm"]), order))
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = _merged_ticks(ratios)
    ax.set_xticks([r for _, r in ticks], [label for label, _ in ticks], fontsize=8,
                  rotation=25, ha="right")
    ax.xaxis.set_minor_locator(NullLocator())
    low, high = ax.get_ylim()
    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if high < 10 * low else NullFormatter())
    ax.set_xlabel("each profile's compute : communication per update and rank")
    ax.set_ylabel(f"speedup over {BASELINE} (×)")
    ax.grid(alpha=0.3, which="both")


def _compute_comm(rows: list[dict[str, Any]]) -> dict[str, float]:
    """{profile: the median compute : communication ratio of the rows' trials' mechanisms}."""
    import statistics

    found: dict[str, list[float]] = {}
    for row in rows:
        for m in (row.get("mechanism") or {}).values():
            for name, ratio in ((m or {}).get("compute_comm") or {}).items():
                if ratio:
                    found.setdefault(name, []).append(float(ratio))
    return {name: statistics.median(v) for name, v in found.items()}


def draw_figures(report: dict[str, Any], out_dir: str, *,
                 errors: list[str] | None = None) -> list[str]:
    """Every figure of the report in ``out_dir``; returns the paths drawn (none without rows).

    With ``errors``, a figure that cannot be drawn is skipped and the reason appended there
    (the others are still drawn); without it, the error is raised."""
    if not report["ranking"]:
        return []
    draws: list[tuple[str, Callable[..., Any], dict[str, str]]] = [
        (FIGURES[0], time_vs_network, {})]
    draws += [(name, accuracy_curves, {"x_key": x_key, "x_label": x_label})
              for name, (x_key, x_label) in CURVE_AXES.items()]
    draws.append((FIGURES[-1], profiles_bars, {}))
    if any(r.get("profile_speedups") for r in report.get("answer", [])):
        draws.append((MECHANISM_FIGURE, speedup_vs_ratio, {}))
    paths = []
    for name, draw, kwargs in draws:
        path = os.path.join(out_dir, name)
        try:
            fig = draw(report, **kwargs)
            try:
                fig.savefig(path)
            finally:
                _pyplot().close(fig)
            paths.append(path)
        except Exception as exc:
            if errors is None:
                raise
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return paths
