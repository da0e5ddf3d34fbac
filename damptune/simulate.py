"""``damptune simulate``: replay a batch-size schedule or a run's history on network profiles.

Without training, the way the AdaDamp paper made its tables: a schedule of ``EPOCHSxBATCH``
segments gives ``epochs × ⌈examples / batch⌉`` updates per segment on
``P = max(1, batch // per_worker_batch)`` ranks; the cost model (:mod:`damptune.netmodel`)
turns them into seconds. With ``--history`` (a checkpoint or a JSON list of records) it
prints the simulated time to reach ``--target`` accuracy on each profile instead.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from damptune.errors import ConfigError
from damptune.netmodel import (
    REPLAY_PROFILES,
    CostModel,
    Network,
    get_profile,
    parse_schedule,
    simulate_schedule,
    simulated_times,
    time_to_target,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    s = sub.add_parser("simulate", help="simulated training time of a schedule or a run",
                       description=__doc__)
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--schedule", help="comma-separated EPOCHSxBATCH segments, e.g. "
                     "'60x128,60x640,80x3200'")
    src.add_argument("--history", help="a checkpoint (.pt) or JSON file of progress records")
    s.add_argument("--target", type=float, default=None,
                   help="with --history: the test accuracy to reach, in (0, 1]")
    s.add_argument("--examples", type=int, help="training examples (with --schedule)")
    s.add_argument("--params", type=int, help="model parameters (read from a checkpoint)")
    s.add_argument("--compute-ms-per-example", type=float,
                   help="forward+backward ms per example on one rank (from a checkpoint)")
    s.add_argument("--compute-ms-fixed", type=float, default=None,
                   help="ms per update on a rank besides the examples (default 0)")
    s.add_argument("--per-worker-batch", type=int, default=128, help="examples per rank")
    s.add_argument("--overhead-ms", type=float, default=None,
                   help="orchestration ms per update, fixed part (default: the replayed run's, "
                   "else the profile's: 16 for the named ones)")
    s.add_argument("--overhead-per-rank-ms", type=float, default=None,
                   help="orchestration ms per update and rank (default: the run's, else the "
                   "profile's: 3.3 for the named ones)")
    s.add_argument("--profile", default="decentralized-moderate",
                   help=f"comma-separated names from {sorted(REPLAY_PROFILES)}, 'all', or "
                   "'custom:GBPS:LATENCY_US[:ring|tree|centralized]'")
    s.add_argument("--json", action="store_true", help="one JSON object per profile")
    s.add_argument("--plot", metavar="FILE.png", help="draw the comparison of profiles")


def _profiles(text: str) -> list[Network]:
    names = sorted(REPLAY_PROFILES) if text == "all" else [p.strip() for p in text.split(",")]
    networks = [get_profile(n) for n in names]
    for net in networks:
        if net.stragglers is not None:
            raise ConfigError("--profile", net.name, f"one of {sorted(REPLAY_PROFILES)} or "
                              "custom:...: a straggler profile's time depends on the draws of "
                              "a run trained on it (train with that profile instead)")
    return networks


def _positive(name: str, value: float | None, required: bool = True) -> float:
    if value is None:
        if required:
            raise ConfigError(name, None, "a positive number (required here)")
        return 0.0
    if not math.isfinite(value) or value < 0 or (required and value == 0):
        raise ConfigError(name, value, "a positive number")
    return value


def _load_history(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if path.endswith(".json"):
        with open(path) as f:
            records = json.load(f)
        return records, {}
    from damptune.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    n_params = sum(int(t.numel()) for t in ckpt["model"].values() if t.is_floating_point())
    return ckpt["history"], {**ckpt["config"], "n_params": n_params}


def run(args: argparse.Namespace) -> int:
    records: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    if args.history:
        records, config = _load_history(args.history)
    networks = [_with_overhead(net, args, config) for net in _profiles(args.profile)]
    base = _cost_model(args, config, networks[0])
    if args.per_worker_batch is None or args.per_worker_batch <= 0:
        raise ConfigError("--per-worker-batch", args.per_worker_batch, "a positive integer")
    if args.schedule:
        results = _replay_schedule(args, base, networks)
    else:
        if args.target is None:
            raise ConfigError("--target", None, "an accuracy in (0, 1] (with --history)")
        norm = _damper_uses_norm(config)
        results = [_replay_history(records, base.with_network(net), target=args.target,
                                   norm=norm) for net in networks]
    for res in results:
        _print_result(args, res)
    if args.plot:
        _plot(args, results)
    return 0


def _with_overhead(network: Network, args: argparse.Namespace,
                   config: dict[str, Any]) -> Network:
    """The profile with the overhead given on the command line, else the replayed run's,
    else its own."""
    terms = []
    for flag, key in (("overhead_ms", "overhead"), ("overhead_per_rank_ms", "overhead_per_rank")):
        ms = getattr(args, flag)
        if ms is None and config.get(key) is not None:
            ms = float(config[key]) * 1e3
        terms.append(None if ms is None else
                     _positive("--" + flag.replace("_", "-"), ms, required=False))
    return network.with_overhead(*terms)


def _damper_uses_norm(config: dict[str, Any]) -> bool:
    from damptune.dampers import DAMPERS

    damper = DAMPERS.get(str(config.get("damper", "")))
    return bool(damper is not None and damper.uses_grad_norm)


def _cost_model(args: argparse.Namespace, config: dict[str, Any], network: Any) -> CostModel:
    """The cost model from the command line, else from the replayed run's configuration."""
    per_example_s = (args.compute_ms_per_example / 1e3 if args.compute_ms_per_example is not None
                     else config.get("compute_per_example"))
    fixed_s = (args.compute_ms_fixed / 1e3 if args.compute_ms_fixed is not None
               else config.get("compute_fixed") or 0.0)
    n_params = args.params if args.params is not None else config.get("n_params")
    return CostModel(
        network=network,
        n_params=int(_positive("--params", n_params)),
        compute_per_example=_positive("--compute-ms-per-example", per_example_s),
        compute_fixed=_positive("--compute-ms-fixed", fixed_s, required=False),
        forward_per_example=config.get("compute_forward_per_example"),
        forward_fixed=config.get("compute_forward_fixed") or 0.0,
        compute_norm=config.get("compute_norm") or 0.0,
    )


def _replay_schedule(args: argparse.Namespace, base: CostModel,
                     networks: list[Any]) -> list[dict[str, Any]]:
    segments = parse_schedule(args.schedule)
    examples = _positive("--examples", args.examples)
    results = []
    for net in networks:
        rows = simulate_schedule(segments, examples=int(examples), cost=base.with_network(net),
                                 per_worker_batch=args.per_worker_batch)
        results.append({"profile": net.name, **_overhead_of(net),
                        "updates": rows[-1]["updates"], "seconds": rows[-1]["seconds"],
                        "segments": rows})
    return results


def _overhead_of(network: Network) -> dict[str, float]:
    return {"overhead_ms": network.overhead_ms,
            "overhead_per_rank_ms": network.overhead_per_rank_ms}


def _replay_history(records: list[dict[str, Any]], cost: CostModel, *,
                    target: float, norm: bool = False) -> dict[str, Any]:
    ttt = time_to_target(records, cost, target=target, norm=norm)
    return {
        "profile": cost.network.name,
        **_overhead_of(cost.network),
        "reached": ttt.reached,
        "seconds": ttt.simulated_seconds if ttt.reached else None,
        "measured_seconds": ttt.measured_seconds if ttt.reached else None,
        "updates": ttt.update,
        "examples_seen": ttt.examples_seen,
        "curve": [(t, r["test_accuracy"]) for r, t in
                  zip(records, simulated_times(records, cost, norm=norm), strict=True)
                  if r.get("kind") == "eval"],
    }


def _print_result(args: argparse.Namespace, res: dict[str, Any]) -> None:
    overhead = (f"overhead {res['overhead_ms']:g} ms + {res['overhead_per_rank_ms']:g} ms "
                "per rank per update")
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if k != "curve"}))
    elif args.schedule:
        print(f"{res['profile']}: {res['updates']} updates, {res['seconds']:.1f} s "
              f"({res['seconds'] / 60:.1f} min); {overhead}")
    elif res["reached"]:
        print(f"{res['profile']}: reached {args.target} after {res['updates']} updates, "
              f"simulated {res['seconds']:.2f} s "
              f"(measured here {res['measured_seconds']:.2f} s); {overhead}")
    else:
        print(f"{res['profile']}: did not reach {args.target} (time-to-target = not reached); "
              f"{overhead}")


def _plot(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for res in results:
        if args.schedule:
            xs, ys = [0.0], [0.0]
            for row in res["segments"]:
                xs.append(row["epochs"])
                ys.append(row["seconds"] / 60)
            ax.plot(xs, ys, marker="o", label=f"{res['profile']} ({ys[-1]:.1f} min)")
        else:
            curve = res["curve"]
            ax.plot([t / 60 for t, _ in curve], [a for _, a in curve], marker=".",
                    label=res["profile"])
    if args.schedule:
        ax.set_xlabel("epochs")
        ax.set_ylabel("simulated wall-clock (min)")
        ax.set_title(f"schedule {args.schedule}")
    else:
        ax.axhline(args.target, color="grey", linestyle="--", linewidth=1, label="target")
        ax.set_xlabel("simulated wall-clock (min)")
        ax.set_ylabel("test accuracy")
        ax.set_title("time to accuracy per network profile")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot)
    plt.close(fig)
