"""Models by name, so that configurations and the command line can name them."""

from __future__ import annotations

from typing import Any

from torch import nn

from models.cnn import CNN
from models.mlp import MLP
from models.wrn import WideResNet

__all__ = ["MODELS", "get_model", "model_class"]

MODELS: dict[str, type[nn.Module]] = {"mlp": MLP, "cnn": CNN, "wrn16_4": WideResNet}
"""Model classes by name. ``mlp`` and ``cnn`` are for CPU; ``wrn16_4`` (BatchNorm) for GPU."""


def model_class(name: str) -> type[nn.Module]:
    """Return the model class registered under ``name``.

    Args:
        name: One of the keys of :data:`MODELS`.

    Returns:
        The class (not an instance).

    Raises:
        ValueError: If ``name`` is not a key of :data:`MODELS`.

    Example:
        >>> model_class("cnn").__name__
        'CNN'
    """
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"model={name!r} is not accepted; expected one of {', '.join(map(repr, MODELS))}."
        ) from None


def get_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the model registered under ``name``.

    Args:
        name: One of the keys of :data:`MODELS`.
        **kwargs: Keyword arguments of the model's constructor; every model takes
            ``input_shape`` and ``n_classes`` (see :class:`~models.mlp.MLP`,
            :class:`~models.cnn.CNN`, :class:`~models.wrn.WideResNet`).

    Returns:
        A freshly initialized model (weights drawn from torch's global generator).

    Raises:
        ValueError: If ``name`` is not a key of :data:`MODELS`, or the constructor rejects an
            argument's value.
        TypeError: If a keyword argument is not one the constructor takes.

    Example:
        >>> model = get_model("mlp", input_shape=(40,), n_classes=10, hidden=64)
        >>> type(model).__name__
        'MLP'
    """
    return model_class(name)(**kwargs)
