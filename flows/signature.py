"""The ``tune`` flow's parameters as its source declares them, read without importing the flow
(the command-line parser must not import Prefect): each parameter's name, type (evaluated in
:mod:`flows.params`) and default when it is a literal.

``damptune tune``'s options are generated from this; their help, written only when printed,
takes each parameter's description as Prefect reads it for the deployment's parameter schema
(``source_descriptions``, as ``flows.tune.flow_descriptions``) and its default from the flow's
signature (``source_defaults``, as ``flows.tune.flow_defaults``), both read from the source
(tests/flows/test_defaults.py compares the help with the schema and the flow's defaults).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import types
import typing
from dataclasses import dataclass
from typing import Any

__all__ = ["FlowParam", "flow_params", "base_type", "source_defaults", "source_descriptions"]

_NO_DEFAULT = object()


@dataclass(frozen=True)
class FlowParam:
    """One parameter of the flow: ``default`` is ``_NO_DEFAULT`` unless it is a literal (every
    default, evaluated: :func:`source_defaults`, which imports what the defaults name)."""

    name: str
    annotation: Any
    default: Any = _NO_DEFAULT


@functools.cache
def flow_params(module: str = "flows.tune", function: str = "tune") -> tuple[FlowParam, ...]:
    """The parameters of ``module.function``, read from its source file."""
    from flows import params

    _, fn = _source(module, function)
    namespace = {**vars(params), **vars(typing)}
    out = []
    for arg, node in _arguments(fn):
        annotation = eval(ast.unparse(arg.annotation), namespace) if arg.annotation else Any  # noqa: S307
        try:
            default = ast.literal_eval(node) if node is not None else _NO_DEFAULT
        except ValueError:
            default = _NO_DEFAULT
        out.append(FlowParam(arg.arg, annotation, default))
    return tuple(out)


@functools.cache
def _source(module: str, function: str) -> tuple[ast.Module, ast.FunctionDef]:
    """The module's parsed source and ``function``'s node in it (read once; not changed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no source for {module}")
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    return tree, fn


def _arguments(fn: ast.FunctionDef) -> list[tuple[ast.arg, ast.expr | None]]:
    """Each parameter of ``fn`` (positional, then keyword-only) with its default's expression
    (None: no default)."""
    positional: list[ast.expr | None] = [None] * (len(fn.args.args) - len(fn.args.defaults))
    defaults = positional + list(fn.args.defaults) + list(fn.args.kw_defaults)
    return list(zip(fn.args.args + fn.args.kwonlyargs, defaults, strict=True))


@functools.cache
def source_defaults(module: str = "flows.tune", function: str = "tune") -> dict[str, Any]:
    """Every parameter's default, as the flow's signature evaluates it, without importing the
    flow (nor Prefect): each default expression evaluated with the names it uses imported
    from where the module imports them (``list(ALGORITHMS)``: ``tasks.grid``).
    tests/flows/test_defaults.py checks it equals ``flows.tune.flow_defaults()``."""
    tree, fn = _source(module, function)
    origins = {alias.asname or alias.name: (node.module, alias.name)
               for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
               for alias in node.names}
    out = {}
    for arg, node in _arguments(fn):
        if node is None:
            continue
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & set(origins)
        namespace = {name: getattr(importlib.import_module(origins[name][0]), origins[name][1])
                     for name in names}
        out[arg.arg] = eval(compile(ast.Expression(node), module, "eval"), namespace)  # noqa: S307
    return out


@functools.cache
def source_descriptions(module: str = "flows.tune", function: str = "tune") -> dict[str, str]:
    """The parameters' descriptions, as Prefect reads them from the flow's docstring for the
    deployment's parameter schema (``flows.tune.flow_descriptions``), without importing the
    flow."""
    from prefect.utilities.callables import parameter_docstrings

    _, fn = _source(module, function)
    return parameter_docstrings(ast.get_docstring(fn))


def base_type(annotation: Any) -> Any:
    """The annotation without its schema keywords and without ``None``: ``int`` for
    ``PositiveInt | None``; a union of several types stays a union of their base types."""
    if typing.get_origin(annotation) is typing.Annotated:
        return base_type(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [base_type(a) for a in typing.get_args(annotation) if a is not type(None)]
        return members[0] if len(members) == 1 else typing.Union[tuple(members)]  # noqa: UP007
    if typing.get_origin(annotation) in (list, dict):
        args = tuple(base_type(a) for a in typing.get_args(annotation))
        return typing.get_origin(annotation)[args]
    return annotation
