"""The shape of the code: the longest functions, how many are over 60 lines, lines per package.

    python bench/code_shape.py [CHECKOUT]    # default: this repository

Counts every function and method outside tests/ and bench/ (``end_lineno - lineno + 1`` of its
``def``, docstring included), as the house rule "functions of at most 60 lines" does.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LIMIT = 60
PACKAGES = ("damptune", "models", "tasks", "flows", "infra")
WATCHED = {("tasks/cell.py", "run_cell"): 40, ("tasks/trial.py", "run_trial"): 40}


def function_lengths(root: Path) -> list[tuple[int, str]]:
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                    out.append((length, f"{path.relative_to(root)}:{node.name}"))
    return sorted(out, reverse=True)


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[1])
    lengths = function_lengths(root)
    over = [name for length, name in lengths if length > LIMIT]
    print(f"longest functions: {', '.join(f'{n} ({n_})' for n_, n in lengths[:3])}")
    verdict = "met" if not over else "not met"
    print(f"functions over {LIMIT} lines: {len(over)} (goal 0: {verdict})")
    for (path, name), goal in WATCHED.items():
        found = [n_ for n_, n in lengths if n == f"{path}:{name}"]
        if found:
            print(f"{path}:{name}: {found[0]} lines (goal <= {goal}: "
                  f"{'met' if found[0] <= goal else 'not met'})")
    for package in PACKAGES:
        lines = sum(len(p.read_text().splitlines()) for p in (root / package).rglob("*.py"))
        print(f"lines in {package}/: {lines}")
    return 0 if not over else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
