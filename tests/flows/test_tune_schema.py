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


def _beyond(schema: dict) -> list:
    """Values just outside a parameter's schema bounds or choices (a list's items, a
    per-model dict's values, each member of a union), each paired with its edge inside."""
    if "anyOf" in schema:
        return [v for member in schema["anyOf"] for v in _beyond(member)]
    if schema.get("type") == "array" and "items" in schema:
        return [([bad], [edge]) for bad, edge in _beyond(schema["items"])]
    if schema.get("type") == "object" and "additionalProperties" in schema:
        return [({"mlp": bad, "cnn": bad}, {"mlp": edge, "cnn": edge})
                for bad, edge in _beyond(schema["additionalProperties"])]
    step = 1 if schema.get("type") == "integer" else 0.5
    out = []
    if "minimum" in schema:
        out.append((schema["minimum"] - step, schema["minimum"]))
    if "exclusiveMinimum" in schema:
        out.append((schema["exclusiveMinimum"], schema["exclusiveMinimum"] + step / 8))
    if "maximum" in schema:
        out.append((schema["maximum"] + step, schema["maximum"]))
    if "enum" in schema:
        out.append(("nope", schema["enum"][0]))
    if "pattern" in schema or "minLength" in schema:
        edge = schema.get("examples", ["ab"])[0]
        out += [("a/b", edge), ("", edge)]
    return out


def test_the_schema_bounds_are_the_flows_own_and_the_server_enforces_them():
    """Every bound or choice of the deployment's parameter schema is one the flow's
    validators enforce too (a value just outside is refused by both, naming the parameter;
    the edge is accepted by both): Prefect's server refuses a run with the value before it
    creates it (``prefect deployment run --param``), with the check it runs there."""
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    from damptune import ConfigError
    from flows.tune import grid_of

    schema = parameter_schema(tune).model_dump_for_openapi()
    checked = []
    for name, prop in schema["properties"].items():
        for bad, edge in _beyond(prop):
            with pytest.raises(ValidationError, match=f"field '{name}"):
                validate({name: bad}, schema, raise_on_error=True)
            with pytest.raises(ConfigError, match=f"{name}="):
                grid_of({name: bad})
            validate({name: edge}, schema, raise_on_error=True)
            grid_of({name: edge})
            checked.append(name)
    assert {"trials", "networks", "epochs", "target_accuracy", "seed", "sampler_seed",
            "validation_seeds", "mode", "pruner", "grid_name", "checkpoint_every",
            "workers_per_trial", "overhead_ms", "algorithms", "models", "dataset",
            "profile"} <= set(checked), checked


def test_the_run_form_offers_the_registries_names_as_choices(monkeypatch):
    """``algorithms``, ``models``, ``dataset`` and ``profile`` are choices in the run form,
    read from the registries when the schema is built: a damper added to ``DAMPERS`` (as
    CONTRIBUTING.md says) is offered with no other change; a custom network profile is still
    accepted beside the named ones."""
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    from damptune.dampers import DAMPERS, GeoDamp
    from damptune.netmodel import PROFILES
    from models.datasets import DATASETS
    from models.registry import MODELS

    monkeypatch.setitem(DAMPERS, "newdamp", GeoDamp)
    schema = parameter_schema(tune).model_dump_for_openapi()
    props = schema["properties"]
    assert props["algorithms"]["items"]["enum"] == list(DAMPERS) and "newdamp" in DAMPERS
    assert props["models"]["items"]["enum"] == list(MODELS)
    assert props["dataset"]["enum"] == list(DATASETS)
    assert props["profile"]["anyOf"][0]["enum"] == list(PROFILES)
    for good in ("ddp-100g", "custom:25:30", "custom:100:10:tree:0.5:0.01"):
        validate({"profile": good}, schema, raise_on_error=True)
    with pytest.raises(ValidationError, match="field 'profile'"):
        validate({"profile": "custom:fast"}, schema, raise_on_error=True)
