"""Is the code in small functions? The longest functions, how many are over 60 lines, lines per
package.

    python bench/code_shape.py [CHECKOUT]    # default: this repository

Counts every function and method outside tests/ and bench/ (``end_lineno - lineno + 1`` of its
``def``, docstring included), as the house rule "functions of at most 60 lines" does.

Goals: 0 functions over 60 lines; ``tasks/cell.py:run_cell`` and ``tasks/trial.py:run_trial``
at most 40 lines each.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import records  # noqa: E402

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
    goals: dict[str, bool | None] = {f"0 functions over {LIMIT} lines": not over}
    figures: dict[str, object] = {"functions": len(lengths), "over_limit": len(over),
                                  "longest_lines": lengths[0][0] if lengths else 0}
    for (path, name), goal in WATCHED.items():
        found = [n_ for n_, n in lengths if n == f"{path}:{name}"]
        goals[f"{path}:{name} <= {goal} lines"] = found[0] <= goal if found else None
        if found:
            figures[f"{name}_lines"] = found[0]
            print(f"{path}:{name}: {found[0]} lines (goal <= {goal}: "
                  f"{'met' if found[0] <= goal else 'not met'})")
    for package in PACKAGES:
        lines = sum(len(p.read_text().splitlines()) for p in (root / package).rglob("*.py"))
        figures[f"lines_{package}"] = lines
        print(f"lines in {package}/: {lines}")
    records.write("code_shape", figures=figures, goals=goals)
    return 0 if not over else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
