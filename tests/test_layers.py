"""The layers' dependencies point one way: flows → tasks → engine (damptune) / models.

Walks every module's imports (the AST, so imports inside functions count too) and checks what
each layer may import. The engine and the models know nothing of Prefect, Optuna or MLflow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORCHESTRATION = {"prefect", "prefect_dask", "optuna", "mlflow"}
# layer → top-level names it must not import
FORBIDDEN = {
    "damptune": ORCHESTRATION | {"tasks", "flows", "infra", "bench", "tests"},
    "models": ORCHESTRATION | {"damptune", "tasks", "flows", "infra", "bench", "tests"},
    "tasks": {"flows", "infra", "bench", "tests"},
    "flows": {"infra", "bench", "tests"},
}


def imported_top_levels(path: Path) -> set[str]:
    """Top-level package names imported anywhere in the file (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def violations(layer: str) -> list[str]:
    found = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        bad = imported_top_levels(path) & FORBIDDEN[layer]
        found += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(bad)]
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_only_downwards(layer: str) -> None:
    assert list((ROOT / layer).rglob("*.py")), f"no modules found under {layer}/"
    assert violations(layer) == []


def test_layers_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import optuna.trial\n    from mlflow import MlflowClient\n")
    assert imported_top_levels(module) >= {"optuna", "mlflow"}
