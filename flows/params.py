"""The types of the ``tune`` flow's parameters: each names its base type and, for the
deployment's parameter schema, its bounds or its choices.

Prefect builds a deployment's parameter schema from the flow's signature: a parameter annotated
``PositiveInt`` gets ``"minimum": 1`` there. Prefect's run form then takes only such values, and
Prefect's server refuses a run whose parameters break the schema before it creates the run
(``prefect deployment run tune/grid --param trials=0``: "Validation failed for field 'trials'.
Failure reason: 0 is less than the minimum of 1"). A call of the flow in Python and
``damptune tune`` reach the grid's own validators (:mod:`damptune.validate`), which name the
parameter, the value given and what is accepted; tests/flows/test_tune_schema.py checks that
the schema's bounds and the validators agree.

The command-line parser reads these types (:mod:`flows.signature`), so this module imports
nothing heavy (no Prefect, pydantic or torch): :class:`Schema` is a pydantic annotation by
protocol only.

Example:
    >>> from typing import get_args
    >>> get_args(PositiveInt)[0], get_args(PositiveInt)[1].keywords
    (<class 'int'>, (('minimum', 1),))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from tasks.choices import GRID_DEVICES, GRID_MODES, OBJECTIVES, PRUNERS, SAMPLERS

__all__ = ["Schema", "Choices", "PositiveInt", "NonNegativeInt", "Seed", "PositiveFloat",
           "NonNegativeFloat", "Accuracy", "Margin", "SeedCount", "GridName", "Mode", "Device",
           "Sampler", "Pruner", "Objective", "Trials", "Epochs", "Target", "Ms", "Algorithm",
           "ModelName", "DatasetName", "Profile", "Networks", "Algorithms", "ModelNames"]


@dataclass(frozen=True)
class Schema:
    """JSON-schema keywords added to a parameter's schema (pydantic calls
    ``__get_pydantic_json_schema__`` on an ``Annotated`` member). Pydantic does not enforce
    them when the flow is called: the grid's validators do, with their own messages."""

    keywords: tuple[tuple[str, Any], ...]

    def __get_pydantic_json_schema__(self, core_schema: Any,
                                     handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        out = handler(core_schema)
        out.update(dict(self.keywords))
        return out

    @classmethod
    def of(cls, **keywords: Any) -> Schema:
        return cls(tuple(keywords.items()))


@dataclass(frozen=True)
class Choices:
    """The names of a registry as a parameter's choices (``enum``), read when the schema is
    built, so that a damper or model added to its registry (CONTRIBUTING.md) is a choice of the
    run form with no other change, and this module imports no registry (torch) to be parsed.

    ``registry`` is ``module:attribute`` of a mapping or sequence of names; with ``custom``
    (a regular expression), a value that matches it is accepted too (``profile``'s
    ``custom:GBPS:US``): the choices then come first in an ``anyOf``, as the run form opens it.
    """

    registry: str
    custom: str | None = None
    example: str | None = None  # a value that matches ``custom``

    def names(self) -> list[str]:
        import importlib

        module, _, attribute = self.registry.partition(":")
        return list(getattr(importlib.import_module(module), attribute))

    def __get_pydantic_json_schema__(self, core_schema: Any,
                                     handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        out = handler(core_schema)
        if self.custom is None:
            out["enum"] = self.names()
        else:
            out["anyOf"] = [{"type": "string", "title": "named", "enum": self.names()},
                            {"type": "string", "title": "custom", "pattern": self.custom,
                             "examples": [self.example]}]
            out.pop("type", None)
        return out


PositiveInt = Annotated[int, Schema.of(minimum=1)]
NonNegativeInt = Annotated[int, Schema.of(minimum=0)]
Seed = Annotated[int, Schema.of(minimum=0, maximum=2**32 - 1)]  # what NumPy accepts
SeedCount = Annotated[int, Schema.of(minimum=0, maximum=100)]  # held-out seeds per cell
PositiveFloat = Annotated[float, Schema.of(exclusiveMinimum=0)]
NonNegativeFloat = Annotated[float, Schema.of(minimum=0)]
Accuracy = Annotated[float, Schema.of(exclusiveMinimum=0, maximum=1)]
Margin = Annotated[float, Schema.of(minimum=0, exclusiveMaximum=1)]  # accuracy above a target
# a prefix of its studies' names
GridName = Annotated[str, Schema.of(minLength=1, pattern="^[^/]+$")]
Mode = Annotated[str, Schema.of(enum=list(GRID_MODES))]
Device = Annotated[str, Schema.of(enum=list(GRID_DEVICES))]
Sampler = Annotated[str, Schema.of(enum=list(SAMPLERS))]
Pruner = Annotated[str, Schema.of(enum=list(PRUNERS))]
Objective = Annotated[str, Schema.of(enum=list(OBJECTIVES))]
Algorithm = Annotated[str, Choices("damptune.dampers:DAMPERS")]
ModelName = Annotated[str, Choices("models.registry:MODELS")]
DatasetName = Annotated[str, Choices("models.datasets:DATASETS")]
Networks = list[PositiveInt]  # network sizes (ranks)
Algorithms = list[Algorithm]
ModelNames = list[ModelName]
# a named network (damptune.netmodel.PROFILES) or custom:GBPS:US[:ring|tree|centralized[:MS[:MS]]]
Profile = Annotated[str, Choices(
    "damptune.netmodel:PROFILES",
    custom=r"^custom:[0-9.eE+-]+:[0-9.eE+-]+(:(ring|tree|centralized)(:[0-9.eE+-]+){0,2})?$",
    example="custom:25:30:ring")]
# one value for every model, or one per model ({"mlp": 12, "cnn": 10}); the dict first, as
# the defaults are: Prefect's run form opens a union on its first type
Trials = dict[str, PositiveInt] | PositiveInt
Epochs = dict[str, PositiveFloat] | PositiveFloat
Target = dict[str, Accuracy] | Accuracy
Ms = NonNegativeFloat | None  # simulated milliseconds; None: the network profile's
