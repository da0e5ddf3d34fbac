from __future__ import annotations

import pytest
import torch

from models import WideResNet


@pytest.mark.parametrize("input_shape", [(3, 32, 32), (1, 8, 8)])
def test_wrn_output_has_one_logit_per_class_for_image_shapes(input_shape):
    model = WideResNet(input_shape=input_shape, n_classes=10, depth=10, widen_factor=1)

    out = model(torch.randn(4, *input_shape))

    assert out.shape == (4, 10)


def test_wrn_defaults_are_wrn_16_4_on_cifar10():
    model = WideResNet(input_shape=(3, 32, 32), n_classes=10).eval()

    n_params = sum(p.numel() for p in model.parameters())

    assert 2.7e6 < n_params < 2.8e6  # WRN-16-4: ≈2.75M
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("input_shape", [(40,), (20,)])
def test_wrn_rejects_1d_dataset_shapes(input_shape):
    with pytest.raises(ValueError, match="^input_shape="):
        WideResNet(input_shape=input_shape, n_classes=10)


@pytest.mark.parametrize(
    ("kwargs", "param"), [({"depth": 15}, "depth"), ({"dropout": 1.0}, "dropout")]
)
def test_wrn_rejects_bad_arguments_naming_the_parameter(kwargs, param):
    with pytest.raises(ValueError, match=f"^{param}="):
        WideResNet(input_shape=(3, 32, 32), n_classes=10, **kwargs)


def test_wrn_docstring_warns_that_batchnorm_breaks_shard_sum():
    assert "BatchNorm" in WideResNet.__doc__
    assert "shard" in WideResNet.__doc__


def test_wrn_in_training_mode_breaks_the_shard_sum_property(assert_shard_sum):
    # BatchNorm normalizes each shard with its own statistics: documented, and the check bites.
    torch.manual_seed(0)
    model = WideResNet(input_shape=(1, 8, 8), n_classes=10, depth=10, widen_factor=1).train()
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))

    with pytest.raises(AssertionError):
        assert_shard_sum(model, x, y)
