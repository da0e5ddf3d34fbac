"""The package's names, imported on first use, and a command line that starts light."""

import importlib
import subprocess
import sys

import damptune

HEAVY = ("torch", "sklearn", "prefect", "mlflow", "optuna", "distributed")


def test_every_exported_name_is_its_modules_object():
    assert set(damptune.__all__) == set(damptune._MODULE_OF)
    for name in damptune.__all__:
        module = importlib.import_module(damptune._MODULE_OF[name])
        assert getattr(damptune, name) is getattr(module, name), name
    assert "train" in dir(damptune)


def test_unknown_name_is_an_attribute_error():
    try:
        damptune.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("damptune.no_such_name did not raise")


def test_the_command_line_parser_imports_no_heavy_package():
    """`damptune --help`, `damptune simulate` and the parsing of every command (the pipeline's
    `tune` and `report` too, loaded through entry points) import none of torch, scikit-learn,
    Prefect, MLflow, Optuna or Dask: each was seconds of CPU per command."""
    code = ("import sys; from damptune.cli import build_parser; build_parser()"
            ".parse_args(['simulate', '--schedule', '1x1', '--examples', '1', '--params', '1']);"
            f" print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
