from __future__ import annotations

import pytest

from models import CNN, MLP, MODELS, WideResNet, get_model, model_class


def test_registry_names_the_three_models():
    assert {"mlp": MLP, "cnn": CNN, "wrn16_4": WideResNet} == MODELS


@pytest.mark.parametrize("name", ["mlp", "cnn", "wrn16_4"])
def test_get_model_builds_the_registered_class(name):
    model = get_model(name, input_shape=(3, 32, 32), n_classes=10)

    assert type(model) is model_class(name) is MODELS[name]


def test_get_model_passes_keyword_arguments():
    model = get_model("mlp", input_shape=(40,), n_classes=3, hidden=7, depth=1)

    assert sum(p.numel() for p in model.parameters()) == 40 * 7 + 7 + 7 * 3 + 3


@pytest.mark.parametrize("lookup", [get_model, model_class])
def test_registry_unknown_name_names_parameter_value_and_accepted(lookup):
    with pytest.raises(ValueError, match="^model='resnet50'") as excinfo:
        lookup("resnet50")

    message = str(excinfo.value)
    assert all(name in message for name in ("'mlp'", "'cnn'", "'wrn16_4'"))
