"""The packages' names, imported on first use, and a command line that starts light."""

import importlib
import subprocess
import sys

import pytest

HEAVY = ("torch", "sklearn", "prefect", "mlflow", "optuna", "distributed")


@pytest.mark.parametrize("package", ["damptune", "tasks"])
def test_every_exported_name_is_its_modules_object(package):
    pkg = importlib.import_module(package)
    module_of = pkg.__getattr__.exported
    assert sorted(pkg.__all__) == sorted(module_of)
    for name in pkg.__all__:
        assert getattr(pkg, name) is getattr(importlib.import_module(module_of[name]), name)
        assert name in dir(pkg)
    with pytest.raises(AttributeError, match="no_such_name"):
        pkg.no_such_name  # noqa: B018


def _imported(code):
    out = subprocess.run([sys.executable, "-c", f"import sys; {code}; print(sorted(m for m in "
                          f"{HEAVY!r} if m in sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_command_line_parser_imports_no_heavy_package():
    """`damptune --help`, `damptune simulate` and the parsing of every command (the pipeline's
    `tune` and `report` too, loaded through entry points) import none of torch, scikit-learn,
    Prefect, MLflow, Optuna or Dask: each was seconds of CPU per command."""
    assert _imported("from damptune.cli import build_parser; build_parser().parse_args("
                     "['simulate', '--schedule', '1x1', '--examples', '1', '--params', '1'])"
                     ) == "[]"


def test_the_report_does_not_import_the_orchestration():
    """`damptune report` reads Optuna and the checkpoints: it imports no Prefect, MLflow or
    Dask (tasks' package no longer imports every task)."""
    got = _imported("import tasks.report")
    assert "prefect" not in got and "mlflow" not in got and "distributed" not in got, got


def test_training_imports_no_scikit_learn():
    """A rank's worker and the flow's dampers need no scikit-learn (the dampers follow its
    parameter protocol without it); only `DampedClassifier` imports it."""
    assert "sklearn" not in _imported("import damptune.ranks, damptune.trainer, tasks.grid")
