from __future__ import annotations

import pytest
import torch

from models import MLP

# The example shapes of the datasets: mnist1d, digits, synthetic, cifar10.
DATASET_SHAPES = [(40,), (1, 8, 8), (20,), (3, 32, 32)]


@pytest.mark.parametrize("input_shape", DATASET_SHAPES)
def test_mlp_output_has_one_logit_per_class_for_each_dataset_shape(input_shape):
    model = MLP(input_shape=input_shape, n_classes=10)

    out = model(torch.randn(5, *input_shape))

    assert out.shape == (5, 10)


def test_mlp_batch_gradient_equals_sum_of_shard_gradients(assert_shard_sum):
    torch.manual_seed(0)
    model = MLP(input_shape=(40,), n_classes=10)
    x, y = torch.randn(16, 40), torch.randint(0, 10, (16,))

    assert_shard_sum(model, x, y)


def test_mlp_defaults_are_the_mnist1d_paper_mlp():
    model = MLP(input_shape=(40,), n_classes=10)

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    assert [(m.in_features, m.out_features) for m in linears] == [(40, 100), (100, 100), (100, 10)]


def test_mlp_depth_zero_is_a_linear_classifier():
    model = MLP(input_shape=(1, 8, 8), n_classes=10, depth=0)

    assert sum(p.numel() for p in model.parameters()) == 64 * 10 + 10


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input_shape": (), "n_classes": 10}, "input_shape"),
        ({"input_shape": (40,), "n_classes": 0}, "n_classes"),
        ({"input_shape": (40,), "n_classes": 10, "depth": -1}, "depth"),
        ({"input_shape": (40,), "n_classes": 10, "hidden": 0}, "hidden"),
    ],
)
def test_mlp_rejects_bad_arguments_naming_the_parameter(kwargs, param):
    with pytest.raises(ValueError, match=f"^{param}="):
        MLP(**kwargs)
