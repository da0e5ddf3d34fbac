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


_JSON_TYPES = {"number": (int, float), "integer": (int,), "string": (str,), "boolean": (bool,),
               "object": (dict,), "array": (list,), "null": (type(None),)}


def _first_type_holds(member: dict, value) -> bool:
    return isinstance(value, _JSON_TYPES[member["type"]])


def test_a_union_parameter_lists_first_the_type_of_its_default():
    """Prefect's run form opens a parameter of several types on the first one of its schema's
    ``anyOf`` (for ``None`` it finds the null type): ``epochs`` and ``target_accuracy`` once
    showed an empty number field instead of their per-model defaults
    (docs/screenshots/prefect-parameters.png shows them filled in)."""
    properties = parameter_schema_from_entrypoint(f"{TUNE_FILE}:tune").model_dump_for_openapi()
    hidden = {name: prop["anyOf"][0]["type"]
              for name, prop in properties["properties"].items()
              if "anyOf" in prop and prop.get("default") is not None
              and not _first_type_holds(prop["anyOf"][0], prop["default"])}
    assert not hidden, f"defaults the run form would not show (first type of anyOf): {hidden}"
