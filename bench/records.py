"""A bench run's result as data: one JSON line appended to ``bench/results/<bench>.jsonl``.

A record says what was measured (``figures``), against what (``goal``, ``verdict``), by which
command, on which code (``commit`` with a ``dirty`` flag, and ``product``: a hash of the product
code's git trees, so that records on unchanged product code can be told apart from the rest),
when (``date``, UTC) and on what machine (CPU model, cores and ``pace_s``: the seconds of a
fixed single-threaded workload of about 1 s, so that runs on different days compare)::

    from bench import records
    records.write("code_shape", figures={"over_60_lines": 0},
                  goals={"0 functions over 60 lines": True})

``DAMPTUNE_BENCH_RESULTS`` names another results directory (the tests use a temporary one);
``--no-record`` on a bench's command line, or ``DAMPTUNE_BENCH_NO_RECORD=1``, makes a dry run.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_ENV = "DAMPTUNE_BENCH_RESULTS"
NO_RECORD_ENV = "DAMPTUNE_BENCH_NO_RECORD"
COMMAND_ENV = "DAMPTUNE_BENCH_COMMAND"  # the command as the user typed it (JSON list)
PRODUCT_PATHS = ("damptune", "models", "tasks", "flows", "infra")
PACE_ITERATIONS = 10_000_000  # about 1 s of one core on this repository's 2-core machine
MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"

# the command as run, taken before --no-record leaves sys.argv (argparse would refuse it)
_ARGV = ["python", *sys.argv]
if "--no-record" in sys.argv:
    sys.argv.remove("--no-record")
    os.environ[NO_RECORD_ENV] = "1"


def results_dir() -> Path:
    """Where the records go: ``$DAMPTUNE_BENCH_RESULTS``, else ``bench/results``."""
    return Path(os.environ.get(RESULTS_ENV) or ROOT / "bench" / "results")


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    return out.stdout.strip() if out.returncode == 0 else ""


def product_of(ref: str = "HEAD") -> str:
    """The id of the product code at the commit ``ref``: a hash of its product trees."""
    trees = "\n".join(_git("rev-parse", f"{ref}:{path}") for path in PRODUCT_PATHS)
    return hashlib.sha1(trees.encode()).hexdigest()[:12]


def code() -> dict[str, Any]:
    """The commit measured, whether the working tree differs from it, and the product's id."""
    changed = _git("status", "--porcelain", "--untracked-files=no")
    product_changed = _git("status", "--porcelain", "--untracked-files=no", "--",
                           *PRODUCT_PATHS)
    return {"commit": _git("rev-parse", "HEAD"), "dirty": bool(changed),
            "product": product_of("HEAD"),
            "product_dirty": bool(product_changed)}


def current_product() -> str:
    """The id of the product code at HEAD."""
    return product_of("HEAD")


def pace_probe() -> float:
    """Seconds of a fixed single-threaded pure-Python loop (about 1 s here): the machine's
    pace on the day, to compare records made on different days or machines."""
    start, acc = time.perf_counter(), 0
    for i in range(PACE_ITERATIONS):
        acc = (acc * 31 + i) % 1_000_003
    return round(time.perf_counter() - start, 3)


def machine() -> dict[str, Any]:
    """The CPU model, its logical cores and the pace probe's seconds."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "pace_s": pace_probe()}


def verdict_of(met: bool | None) -> str:
    """``"met"``, ``"not met"``, or ``"not measured"`` for None."""
    return NOT_MEASURED if met is None else MET if met else NOT_MET


def _clean(value: Any) -> Any:
    """JSON-safe and short: floats to 4 significant digits, NaN and infinities to None."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.4g}")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def make_record(bench: str, *, figures: dict[str, Any], goals: dict[str, bool | None],
                command: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """The record of one run: ``goals`` maps each goal's text to whether it was met (None:
    not measured); one goal gives a text and a verdict, several a list and a verdict per goal."""
    if not goals:
        raise ValueError(f"bench {bench!r}: a record needs at least one goal; got none. A "
                         "bench that guards no goal is an experiment (DESIGN.md, rule 4.8)")
    if command is None:
        given = os.environ.get(COMMAND_ENV)
        command = json.loads(given) if given else _ARGV
    texts = sorted(goals)
    goal: str | list[str] = texts[0] if len(texts) == 1 else texts
    verdict: str | dict[str, str] = (verdict_of(goals[texts[0]]) if len(texts) == 1
                                     else {t: verdict_of(goals[t]) for t in texts})
    when = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    record = {"bench": bench, "command": list(command), **code(), "date": when,
              "machine": machine(), "figures": _clean(figures), "goal": goal,
              "verdict": verdict}
    record.update(_clean(extra))
    return record


def append(record: dict[str, Any], *, directory: Path | None = None) -> Path:
    """Append ``record`` as one JSON line to ``<directory>/<bench>.jsonl``."""
    path = (directory or results_dir()) / f"{record['bench']}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
    return path


def write(bench: str, *, figures: dict[str, Any], goals: dict[str, bool | None],
          **extra: Any) -> Path | None:
    """Record a run of ``bench`` (see :func:`make_record`) and print where; None on a dry run
    (``--no-record``)."""
    if os.environ.get(NO_RECORD_ENV, "") not in ("", "0"):
        print("record: not written (--no-record)")
        return None
    record = make_record(bench, figures=figures, goals=goals, **extra)
    path = append(record)
    print(f"record: {path} (verdict: {record['verdict']})")
    return path


def read(bench: str | None = None, *, directory: Path | None = None) -> list[dict[str, Any]]:
    """Every record (of ``bench``, or of all benches), oldest first within a bench."""
    folder = directory or results_dir()
    paths = [folder / f"{bench}.jsonl"] if bench else sorted(folder.glob("*.jsonl"))
    out = []
    for path in paths:
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out
