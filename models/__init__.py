"""Models and datasets for damptune, in plain PyTorch, numpy and scikit-learn.

Nothing here knows about the engine or the orchestration: a model is an ``nn.Module`` built
from ``input_shape`` and ``n_classes``; a dataset is a :class:`Dataset` of numpy arrays built
locally (nothing is downloaded).

Example:
    >>> from models import get_model, load_dataset
    >>> data = load_dataset("digits", seed=0)
    >>> model = get_model("cnn", input_shape=data.input_shape, n_classes=data.n_classes)
"""

from models.cnn import CNN
from models.datasets import DATASETS, Dataset, check_dataset, default_cache_dir, load_dataset
from models.mlp import MLP
from models.registry import MODELS, get_model, model_class
from models.wrn import WideResNet

__all__ = [
    "CNN",
    "DATASETS",
    "MLP",
    "MODELS",
    "Dataset",
    "WideResNet",
    "check_dataset",
    "default_cache_dir",
    "get_model",
    "load_dataset",
    "model_class",
]
