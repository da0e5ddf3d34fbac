"""The `tune` flow explains itself: every parameter has a description in the deployment's
parameter schema, which Prefect builds from the docstring's Google-style ``Args:`` section (one
``name: description`` entry per parameter; an entry naming several parameters describes none)."""

import importlib
import inspect

import pytest
from prefect.utilities.callables import parameter_schema, parameter_schema_from_entrypoint

from flows.tune import tune

TUNE_FILE = importlib.import_module("flows.tune").__file__


@pytest.mark.parametrize("build", [
    lambda: parameter_schema(tune),  # prefect deploy, flow.to_deployment, serve
    lambda: parameter_schema_from_entrypoint(f"{TUNE_FILE}:tune"),  # read from the source
], ids=["flow", "entrypoint"])
def test_tune_schema_describes_every_parameter(build):
    properties = build().model_dump_for_openapi()["properties"]
    assert set(properties) == set(inspect.signature(tune.fn).parameters)
    undescribed = sorted(name for name, prop in properties.items()
                         if not str(prop.get("description") or "").strip())
    assert not undescribed, ("flow parameters without a description in the deployment's schema "
                             f"(give each its own line in tune's docstring, Args:): {undescribed}")
