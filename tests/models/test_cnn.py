from __future__ import annotations

import pytest
import torch

from models import CNN

# The example shapes of the datasets: mnist1d, digits, synthetic, cifar10.
DATASET_SHAPES = [(40,), (1, 8, 8), (20,), (3, 32, 32)]


@pytest.mark.parametrize("input_shape", DATASET_SHAPES)
def test_cnn_output_has_one_logit_per_class_for_each_dataset_shape(input_shape):
    model = CNN(input_shape=input_shape, n_classes=10)

    out = model(torch.randn(5, *input_shape))

    assert out.shape == (5, 10)


@pytest.mark.parametrize("input_shape", [(40,), (1, 8, 8)])
def test_cnn_batch_gradient_equals_sum_of_shard_gradients(input_shape, assert_shard_sum):
    torch.manual_seed(0)
    model = CNN(input_shape=input_shape, n_classes=10)
    x, y = torch.randn(16, *input_shape), torch.randint(0, 10, (16,))

    assert_shard_sum(model, x, y)


def test_cnn_on_mnist1d_is_the_paper_cnn_with_about_5k_parameters():
    model = CNN(input_shape=(40,), n_classes=10)

    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv1d)]

    assert [(c.kernel_size, c.stride, c.padding) for c in convs] == [
        ((5,), (2,), (1,)),
        ((3,), (2,), (1,)),
        ((3,), (2,), (1,)),
    ]
    assert sum(p.numel() for p in model.parameters()) == 5210


def test_cnn_uses_conv2d_for_images():
    model = CNN(input_shape=(1, 8, 8), n_classes=10, channels=8)

    assert any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert not any(isinstance(m, torch.nn.Conv1d) for m in model.modules())


@pytest.mark.parametrize("input_shape", [(2,), (1, 2, 8), (1, 1, 8, 8)])
def test_cnn_rejects_input_shapes_it_cannot_convolve(input_shape):
    with pytest.raises(ValueError, match="^input_shape="):
        CNN(input_shape=input_shape, n_classes=10)
