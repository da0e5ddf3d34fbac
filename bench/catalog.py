"""The maintained benches and the timed commands: names, questions and goals.

A maintained bench is a script ``bench/<name>.py`` that guards a goal: its module docstring's
first sentence is its question, a paragraph starting ``Goal:`` or ``Goals`` states the goal,
and its ``main`` ends by writing a record (:mod:`bench.records`). The catalogue reads the
docstrings without importing the scripts (they import torch, Dask, Prefect).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MAX_BENCHES = 16  # issue 73: a bench that guards no goal is an experiment, not kept

BENCHES = (  # the maintained benches, in the order `python -m bench list` shows them
    "step_time", "trial_throughput", "grid_throughput", "pipeline_overhead", "cluster_start",
    "idle_cluster", "mlflow_store", "progress_poll", "network_model", "cost_ceiling",
    "objective_noise", "search_efficiency", "answer_stability", "soak", "code_shape",
    "stragglers",
)

# commands timed by `python -m bench time NAME -- COMMAND`: name -> (question, goal in seconds)
TIMED = {
    "make-run": ("How long does `make run` (the full default grid, deployment path) take?",
                 1800.0),
    "make-test": ("How long does `make test` (the whole test suite, what CI runs) take?",
                  1320.0),
    "make-smoke": ("How long does `make smoke` (the first run: install, stack, the smoke grid) "
                   "take?", 600.0),
}


def path_of(name: str) -> Path:
    """The script of the maintained bench ``name``."""
    if name not in BENCHES:
        raise ValueError(f"no maintained bench {name!r}; the benches are: "
                         f"{', '.join(sorted(BENCHES))} (python -m bench list)")
    return BENCH_DIR / f"{name}.py"


def docstring(name: str) -> str:
    return ast.get_docstring(ast.parse(path_of(name).read_text())) or ""


def question(name: str) -> str:
    """The docstring's first sentence, on one line."""
    first = " ".join(docstring(name).split("\n\n", 1)[0].split())
    match = re.match(r"(.+?[?.])(\s|$)", first)
    return match.group(1) if match else first


def goal(name: str) -> str:
    """The docstring's paragraph that starts with ``Goal:`` or ``Goals``, on one line."""
    match = re.search(r"^Goals?\b.*?(?=\n\s*\n|\Z)", docstring(name), re.M | re.S)
    if not match:
        raise ValueError(f"bench/{name}.py's docstring states no goal: a paragraph starting "
                         "'Goal:' or 'Goals' is required of a maintained bench")
    return re.split(r"\s+Run:", " ".join(match.group(0).split()), maxsplit=1)[0]
