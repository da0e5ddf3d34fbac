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

from tasks.choices import GRID_DEVICES, GRID_MODES, PRUNERS, SAMPLERS

__all__ = ["Schema", "PositiveInt", "NonNegativeInt", "Seed", "PositiveFloat",
           "NonNegativeFloat", "Accuracy", "SeedCount", "GridName", "Mode", "Device", "Sampler",
           "Pruner"]


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


def _typed(kind: type, **keywords: Any) -> Any:
    return Annotated[kind, Schema(tuple(keywords.items()))]


PositiveInt = _typed(int, minimum=1)
NonNegativeInt = _typed(int, minimum=0)
Seed = _typed(int, minimum=0, maximum=2**32 - 1)  # what NumPy accepts
SeedCount = _typed(int, minimum=0, maximum=100)  # held-out seeds per cell
PositiveFloat = _typed(float, exclusiveMinimum=0)
NonNegativeFloat = _typed(float, minimum=0)
Accuracy = _typed(float, exclusiveMinimum=0, maximum=1)
GridName = _typed(str, minLength=1, pattern="^[^/]+$")  # a prefix of its studies' names
Mode = _typed(str, enum=list(GRID_MODES))
Device = _typed(str, enum=list(GRID_DEVICES))
Sampler = _typed(str, enum=list(SAMPLERS))
Pruner = _typed(str, enum=list(PRUNERS))
