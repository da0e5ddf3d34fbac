"""Network cost model: simulated wall-clock of data-parallel training on any cluster.

Time of one model update with global batch ``B`` on ``P`` ranks::

    t(B, P) = compute(⌈B/P⌉) + comm(P) + overhead(P) [+ damper(P)]
    compute(n)  = ⌈n/m⌉ · compute_fixed + n · compute_per_example   (calibrated, or given)
    overhead(P) = overhead_fixed + overhead_per_rank · P        (a term of the network profile)

**Micro-batches** (``m`` = ``micro_batch``, the config's ``micro_batch`` or
``per_worker_batch``): a rank computes its share of ``n`` examples as the hardware runs it, in
``⌈n/m⌉`` forward+backward passes of at most ``m`` examples whose gradients add up (a GPU holds
the activations of ``m`` examples, not of ``n``), so each pass pays the fixed cost once. Where
shares never exceed ``m`` (the tuning grid: ``P = ⌈B/per_worker_batch⌉`` and a batch-size cap
of ``max_workers × per_worker_batch``) it is one pass, ``compute_fixed + n ·
compute_per_example``, as before; a share grows past ``m`` when P is capped at
``max_workers`` while ``B`` keeps growing (a cap above ``max_workers × per_worker_batch``).
``micro_batch=None`` on a ``CostModel`` charges one pass whatever ``n`` (``damptune simulate``).

with ``M = n_params × bytes_per_param`` bytes of gradients (or weights), link bandwidth ``β``
(bytes/s) and per-message latency ``α`` (s):

* **decentralized, ring all-reduce** (reduce-scatter, then all-gather; each of the
  ``2(P−1)`` steps moves ``M/P`` bytes on every link at once)::

      comm_ring(P) = 2 (P − 1) · (α + M / (P β))

* **decentralized, tree all-reduce** (binary-tree reduce, then broadcast)::

      comm_tree(P) = 2 ⌈log2 P⌉ · (α + M / β)

* **centralized, parameter server**: the master sends the weights to each of the P ranks and
  receives P gradients, all through its one link (fan-out, fan-in)::

      comm_ps(P) = 2 P · (α + M / β)

``comm(1) = 0`` for all-reduce (nothing to exchange); the parameter server still ships
weights and gradients to its one rank. Assumptions: full-duplex links of equal bandwidth, no
overlap of communication with computation, no contention besides what the formulas state,
``bytes_per_param`` = 4 (float32), and the ranks enter the all-reduce together (a rank's
measured ``time_comm`` also holds its wait for the slowest rank, which is machine noise, not a
network parameter). ``bandwidth_gbps`` is goodput: TCP/IP headers take ~4–6 % of a link's
nominal rate (1448 payload bytes per 1514-byte frame). The default profile, ``ddp-100g``
(100 Gb/s, 10 µs, ring), is a data-parallel cluster as damptune runs it; the other named
profiles are the AdaDamp paper's (its Table 2 stays reproducible with them). Checked against
gloo on shaped veth links (``bench/network_model.py``): gloo's all-reduce is the ring for every
P, within 1–7 % of the formula.

**Orchestration overhead** ``overhead(P)``: what an update costs besides computing and moving
gradients — launching the ranks' work, gathering their results, the optimizer step — a fixed
part plus a part per rank. The paper's profiles charge **16 ms + 3.3 ms × P**, the
overhead the AdaDamp paper's own simulations charged per update (recovered from its authors'
code: about 16 ms plus 3.3 ms per worker of a centrally orchestrated Dask update, on top of
the gradient time); ``ddp-100g`` charges the engine's own, measured: 0.25 ms and nothing per
rank (``ENGINE_OVERHEAD_MS``). The per-rank part is what makes very large P stop paying.
Measure your own with ``bench/step_time.py`` (the engine's rank loop, fitted as fixed + per
rank) and pass it as ``overhead``/``overhead_per_rank`` (``damptune simulate --overhead-ms
--overhead-per-rank-ms``; the flow's ``overhead_ms``/``overhead_per_rank_ms``).

**The damper's own work** is charged as it would run across the ranks: AdaDamp's training-loss
pass over its subset (``damper_examples`` of an update record) costs a forward pass of
``⌈n/P⌉`` examples per rank, an all-reduce of one number and one orchestration overhead;
RadaDamp's gradient norm costs ``compute_norm`` per update. Evaluation is measurement, not
training: it is never charged.

Example:
    >>> cost = CostModel(network=get_profile("decentralized-moderate"), n_params=2_750_000,
    ...                  compute_per_example=0.612e-3)
    >>> round(cost.update_seconds(batch_size=128, n_ranks=1) * 1e3, 1)
    97.6
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from damptune.errors import ConfigError
from damptune.stragglers import AWS_5PCT, Stragglers

__all__ = [
    "Network",
    "PAPER_OVERHEAD_MS",
    "PAPER_OVERHEAD_PER_RANK_MS",
    "PROFILES",
    "REPLAY_PROFILES",
    "DEFAULT_PROFILE",
    "ENGINE_OVERHEAD_MS",
    "get_profile",
    "CostModel",
    "parse_schedule",
    "simulate_schedule",
    "simulated_times",
    "time_to_target",
    "TimeToTarget",
    "calibrate_compute",
    "NOT_REACHED",
]

NOT_REACHED = math.inf  # the simulated time-to-target of a run that never reaches the target
# The AdaDamp paper's simulated orchestration overhead per update (its authors' code): a fixed
# part and a part per worker, in milliseconds. Defaults of the named profiles.
PAPER_OVERHEAD_MS = 16.0
PAPER_OVERHEAD_PER_RANK_MS = 3.3
SCALAR_BYTES = 8.0  # one float64: the damper's loss, all-reduced


@dataclass(frozen=True)
class Network:
    """A cluster network: bandwidth in Gb/s, latency in µs, how gradients travel, and the
    orchestration overhead of one update (ms, a fixed part plus a part per rank).

    ``mode`` is ``"decentralized"`` (all-reduce with ``algorithm`` ``"ring"`` or ``"tree"``) or
    ``"centralized"`` (parameter server through one master link).
    """

    name: str
    bandwidth_gbps: float
    latency_us: float
    mode: str = "decentralized"
    algorithm: str = "ring"
    overhead_ms: float = 0.0  # per update, whatever the ranks
    overhead_per_rank_ms: float = 0.0  # per update and rank
    # how each rank's compute varies per update (damptune.stragglers); None: it never does
    stragglers: Stragglers | None = None

    def __post_init__(self) -> None:
        for field_name in ("bandwidth_gbps", "latency_us", "overhead_ms",
                           "overhead_per_rank_ms"):
            value = getattr(self, field_name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0 or (
                field_name == "bandwidth_gbps" and value == 0
            ):
                raise ConfigError(field_name, value, "a positive finite number")
        if self.mode not in ("decentralized", "centralized"):
            raise ConfigError("mode", self.mode, "'decentralized' or 'centralized'")
        if self.algorithm not in ("ring", "tree"):
            raise ConfigError("algorithm", self.algorithm, "'ring' or 'tree'")

    @property
    def bytes_per_second(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    def overhead_seconds(self, n_ranks: int) -> float:
        """Orchestration seconds of one update on ``n_ranks`` ranks."""
        return (self.overhead_ms + self.overhead_per_rank_ms * n_ranks) * 1e-3

    def with_overhead(self, overhead_ms: float | None = None,
                      overhead_per_rank_ms: float | None = None) -> Network:
        """This network with its overhead terms replaced (None keeps a term)."""
        return dataclasses.replace(
            self,
            overhead_ms=self.overhead_ms if overhead_ms is None else overhead_ms,
            overhead_per_rank_ms=(self.overhead_per_rank_ms if overhead_per_rank_ms is None
                                  else overhead_per_rank_ms))

    def comm_seconds(self, n_ranks: int, n_bytes: float) -> float:
        """Seconds to exchange ``n_bytes`` of gradients (and weights) among ``n_ranks``."""
        a, b, p = self.latency_s, self.bytes_per_second, n_ranks
        if self.mode == "centralized":
            return 2 * p * (a + n_bytes / b)
        if p <= 1:
            return 0.0
        if self.algorithm == "tree":
            return 2 * math.ceil(math.log2(p)) * (a + n_bytes / b)
        return 2 * (p - 1) * (a + n_bytes / (p * b))


# The engine's own overhead per update beyond computing, with its ranks running segments
# (``damptune overhead --ranks 1,2``, median at P = 1 on this 2-core machine: 0.16 ms for the
# MLP, 0.22 ms for the CNN; rounded up). Nothing per rank: a rank loop's exchange is the
# all-reduce, which the link model charges (at P = 2 the extra measured here, 0.7-2.5 ms, is
# that exchange between two processes sharing two cores, not orchestration).
ENGINE_OVERHEAD_MS = 0.25
PROFILES: dict[str, Network] = {
    net.name: net.with_overhead(PAPER_OVERHEAD_MS, PAPER_OVERHEAD_PER_RANK_MS) for net in (
        Network("decentralized-moderate", 54.0, 0.05),
        Network("decentralized-high", 800.0, 0.025),
        Network("centralized", 54.0, 0.05, mode="centralized"),
    )
}
# A data-parallel GPU cluster as damptune runs it: 100 Gb/s links with 10 µs per message (an
# RDMA-class cluster fabric; cloud TCP is 25-50 µs), gloo's ring all-reduce, and the engine's
# measured overhead instead of the paper's Dask host. The grid's default.
PROFILES["ddp-100g"] = Network("ddp-100g", 100.0, 10.0, overhead_ms=ENGINE_OVERHEAD_MS)
# ddp-100g's links and overhead, with AWS's stragglers (damptune.stragglers): a rank is slowed
# 2-3x on 5 % of its updates. Only the stragglers differ from ddp-100g, so the two compare them.
PROFILES["aws-5pct"] = dataclasses.replace(PROFILES["ddp-100g"], name="aws-5pct",
                                           stragglers=AWS_5PCT)
DEFAULT_PROFILE = "ddp-100g"
# the named profiles another run's history replays on: a straggler profile's time depends on
# the draws of the run itself (its seed and ``sync``, which choose its gradients), so only a
# run trained on it has that time (its records' ``straggle``)
REPLAY_PROFILES: dict[str, Network] = {
    name: net for name, net in PROFILES.items() if net.stragglers is None}
_CUSTOM = "'custom:GBPS:LATENCY_US[:ring|tree|centralized[:OVERHEAD_MS[:PER_RANK_MS]]]'"


def get_profile(profile: str | Network) -> Network:
    """A named profile, a ``Network``, or
    ``"custom:GBPS:US[:centralized|ring|tree[:OVERHEAD_MS[:PER_RANK_MS]]]"`` (overhead 0 unless
    given)."""
    if isinstance(profile, Network):
        return profile
    if isinstance(profile, str) and profile in PROFILES:
        return PROFILES[profile]
    if isinstance(profile, str) and profile.startswith("custom:"):
        network = _custom(profile)
        if network is not None:
            return network
    raise ConfigError("profile", profile, f"one of {sorted(PROFILES)} or {_CUSTOM}")


def _custom(profile: str) -> Network | None:
    parts = profile.split(":")[1:]
    if not 2 <= len(parts) <= 5:
        return None
    try:
        gbps, us, *overhead = [float(p) for p in parts[:2] + parts[3:]]
    except ValueError:
        return None
    extra = parts[2] if len(parts) > 2 else "ring"
    fixed, per_rank = (overhead + [0.0, 0.0])[:2]
    if extra == "centralized":
        network = Network(profile, gbps, us, mode="centralized")
    else:
        network = Network(profile, gbps, us, algorithm=extra)
    return network.with_overhead(fixed, per_rank)


@dataclass(frozen=True)
class CostModel:
    """Seconds per update for a model of ``n_params`` on ``network`` (see module docstring)."""

    network: Network
    n_params: int
    compute_per_example: float  # seconds of forward+backward per example on one rank
    compute_fixed: float = 0.0  # seconds per update on a rank regardless of its share
    # forward pass only (the damper's loss pass); None: a third of forward+backward
    forward_per_example: float | None = None
    forward_fixed: float = 0.0
    compute_norm: float = 0.0  # seconds of the gradient's squared norm (RadaDamp), per update
    bytes_per_param: int = 4
    micro_batch: int | None = None  # examples per pass (None: a rank's share in one pass)

    @property
    def model_bytes(self) -> float:
        return float(self.n_params * self.bytes_per_param)

    def compute_seconds(self, batch_size: int, n_ranks: int) -> float:
        """One rank's share ``n = ⌈B/P⌉`` in ``⌈n/m⌉`` micro-batches: ``⌈n/m⌉ ·
        compute_fixed + n · compute_per_example`` (one pass when ``micro_batch`` is None)."""
        share = math.ceil(batch_size / n_ranks)
        passes = max(1, math.ceil(share / self.micro_batch)) if self.micro_batch else 1
        return passes * self.compute_fixed + share * self.compute_per_example

    def comm_seconds(self, n_ranks: int) -> float:
        return self.network.comm_seconds(n_ranks, self.model_bytes)

    def overhead_seconds(self, n_ranks: int) -> float:
        return self.network.overhead_seconds(n_ranks)

    def damper_seconds(self, examples: int, n_ranks: int) -> float:
        """A loss pass of the damper over ``examples`` split across ``n_ranks`` ranks: a
        forward pass per rank, an all-reduce of the loss, one orchestration overhead."""
        if examples <= 0:
            return 0.0
        per_example = (self.forward_per_example if self.forward_per_example is not None
                       else self.compute_per_example / 3)
        return (self.forward_fixed + math.ceil(examples / n_ranks) * per_example
                + self.network.comm_seconds(n_ranks, SCALAR_BYTES)
                + self.overhead_seconds(n_ranks))

    def update_seconds(self, *, batch_size: int, n_ranks: int, damper_examples: int = 0,
                       norm: bool = False, straggle: float = 1.0) -> float:
        """One update; with the damper's loss pass over ``damper_examples`` before it, and
        its gradient norm (``norm``), when the damper does that work. ``straggle``: the
        straggler factor of the rank the update waited for (its compute takes that times a
        share's; :mod:`damptune.stragglers`)."""
        return (self.compute_seconds(batch_size, n_ranks) * straggle
                + self.comm_seconds(n_ranks)
                + self.overhead_seconds(n_ranks)
                + self.damper_seconds(damper_examples, n_ranks)
                + (self.compute_norm if norm else 0.0))

    def with_network(self, network: Network) -> CostModel:
        return dataclasses.replace(self, network=network)


# -- schedules (the paper's tables) -------------------------------------------------------------
_SEGMENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x\s*(\d+)\s*$")


def parse_schedule(text: str) -> list[tuple[float, int]]:
    """``"60x128,60x640"`` → ``[(60.0, 128), (60.0, 640)]`` (epochs × batch size)."""
    segments = []
    for part in str(text).split(","):
        match = _SEGMENT.match(part)
        if not match:
            raise ConfigError("schedule", part.strip() or text,
                              "comma-separated EPOCHSxBATCH segments such as '60x128,80x3200'")
        epochs, batch = float(match.group(1)), int(match.group(2))
        if epochs <= 0 or batch <= 0:
            raise ConfigError("schedule", part.strip(), "positive epochs and batch size")
        segments.append((epochs, batch))
    return segments


def simulate_schedule(
    segments: Iterable[tuple[float, int]], *, examples: int, cost: CostModel, per_worker_batch: int
) -> list[dict[str, Any]]:
    """Per segment: updates (``epochs × ⌈examples / batch⌉``), ranks, seconds (cumulative)."""
    if examples <= 0:
        raise ConfigError("examples", examples, "a positive number of training examples")
    if per_worker_batch <= 0:
        raise ConfigError("per_worker_batch", per_worker_batch, "a positive integer")
    rows, total_updates, total_seconds, total_epochs = [], 0, 0.0, 0.0
    for epochs, batch in segments:
        updates = math.ceil(epochs * math.ceil(examples / batch))
        ranks = max(1, batch // per_worker_batch)
        seconds = updates * cost.update_seconds(batch_size=batch, n_ranks=ranks)
        total_updates += updates
        total_seconds += seconds
        total_epochs += epochs
        rows.append({"epochs": total_epochs, "batch_size": batch, "n_workers": ranks,
                     "updates": total_updates, "seconds": total_seconds})
    return rows


# -- histories -----------------------------------------------------------------------------------
def simulated_times(history: Iterable[dict[str, Any]], cost: CostModel, *,
                    norm: bool = False) -> list[float]:
    """Cumulative simulated seconds after each record of an engine history (``norm``: the
    run's damper computes the gradient norm, as RadaDamp does)."""
    out, total = [], 0.0
    for record in history:
        if record.get("kind", "update") == "update":
            total += cost.update_seconds(batch_size=int(record["batch_size"]),
                                         n_ranks=int(record["n_workers"]),
                                         damper_examples=int(record.get("damper_examples", 0)),
                                         norm=norm, straggle=float(record.get("straggle", 1.0)))
        out.append(total)
    return out


@dataclass(frozen=True)
class TimeToTarget:
    """When a run first reached ``target``: simulated and measured seconds, or NOT_REACHED."""

    profile: str
    reached: bool
    simulated_seconds: float
    measured_seconds: float
    update: int | None
    examples_seen: int | None


def time_to_target(
    history: list[dict[str, Any]],
    cost: CostModel,
    *,
    target: float,
    metric: str = "test_accuracy",
    norm: bool = False,
) -> TimeToTarget:
    """Simulated and measured wall-clock until the first evaluation with ``metric >= target``.

    A run that never reaches the target gets ``reached=False`` and ``NOT_REACHED`` (``inf``)
    seconds — never zero.
    """
    if not 0 < target <= 1 and metric.endswith("accuracy"):
        raise ConfigError("target", target, "an accuracy in (0, 1]")
    evals = [r for r in history if r.get("kind") == "eval"]
    if not evals:
        raise ConfigError("history", f"{len(history)} records without evaluations",
                          "a history with evaluation records (eval_every)")
    times = simulated_times(history, cost, norm=norm)
    for record, t in zip(history, times, strict=True):
        if record.get("kind") == "eval" and record.get(metric, -math.inf) >= target:
            return TimeToTarget(cost.network.name, True, t, float(record["time_elapsed"]),
                                int(record["update"]), int(record["examples_seen"]))
    return TimeToTarget(cost.network.name, False, NOT_REACHED, NOT_REACHED, None, None)


# -- compute calibration -------------------------------------------------------------------------
def _cache_file() -> Path:
    root = os.environ.get("DAMPTUNE_CACHE") or os.path.join(Path.home(), ".cache", "damptune")
    return Path(root) / "compute.json"


def calibrate_compute(
    key: str,
    step: Callable[[int], None],
    *,
    batch_sizes: tuple[int, ...] = (16, 64),
    repeats: int = 9,
    cache: bool = True,
) -> tuple[float, float]:
    """Measure forward+backward time: returns (fixed seconds, seconds per example).

    ``step(n)`` runs one forward+backward on ``n`` examples. The fastest of ``repeats`` runs
    at each batch size (the least disturbed by other processes on a busy machine) gives a line
    ``fixed + n · per_example``; the result is cached under ``key`` (model, device, batch
    sizes) in ``$DAMPTUNE_CACHE/compute.json``.
    """
    with _CALIBRATION_LOCK:  # concurrent runs of one process wait for one measurement
        return _calibrate(key, step, batch_sizes=batch_sizes, repeats=repeats, cache=cache)


_CALIBRATION_LOCK = threading.Lock()


def _calibrate(
    key: str, step: Callable[[int], None], *, batch_sizes: tuple[int, ...], repeats: int,
    cache: bool,
) -> tuple[float, float]:
    path = _cache_file()
    full_key = f"{key}|{','.join(map(str, batch_sizes))}"
    if cache and path.exists():
        try:
            known = json.loads(path.read_text())
            if full_key in known:
                fixed, per_example = known[full_key]
                return float(fixed), float(per_example)
        except (OSError, ValueError):
            pass
    fastest = []
    for n in batch_sizes:
        step(n)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step(n)
            times.append(time.perf_counter() - t0)
        fastest.append(min(times))
    (n0, t0_), (n1, t1_) = (batch_sizes[0], fastest[0]), (batch_sizes[-1], fastest[-1])
    per_example = max((t1_ - t0_) / (n1 - n0), 1e-9) if n1 != n0 else t1_ / n1
    fixed = max(t0_ - per_example * n0, 0.0)
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            known = json.loads(path.read_text()) if path.exists() else {}
            known[full_key] = [fixed, per_example]
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except (OSError, ValueError):
            pass
    return fixed, per_example
