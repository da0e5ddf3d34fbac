"""Datasets as in-memory numpy arrays, built locally: damptune never downloads data.

``mnist1d`` is generated with the ``mnist1d`` package's generator (and cached on disk),
``digits`` is scikit-learn's bundled 8x8 digits, ``synthetic`` is a seeded Gaussian-blobs
problem, and ``cifar10`` is read from a directory the user supplies.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pickle
import random
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DATASETS", "Dataset", "check_dataset", "default_cache_dir", "load_dataset"]

DATASETS: tuple[str, ...] = ("mnist1d", "digits", "synthetic", "cifar10")
"""Names accepted by :func:`load_dataset`."""

_TEST_FRACTION = 0.2  # digits and synthetic: share of the examples held out for testing
_SYNTHETIC_CLASSES = 10
_SYNTHETIC_FEATURES = 20
_SYNTHETIC_SAMPLES = 2000
_SYNTHETIC_STD = 6.0  # blob spread: a linear model gets ≈95 %, not 100 %

_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = "test_batch"
_CIFAR_SUBDIR = "cifar-10-batches-py"
_CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)  # per channel, of [0, 1]
_CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A classification dataset held in memory, split into train and test arrays.

    Attributes:
        name: The name it was loaded by (one of :data:`DATASETS`).
        X_train: Training inputs, float32, shape ``(n_train, *input_shape)``.
        y_train: Training labels, int64, shape ``(n_train,)``, values in ``[0, n_classes)``.
        X_test: Test inputs, float32, shape ``(n_test, *input_shape)``.
        y_test: Test labels, int64, shape ``(n_test,)``.
        n_classes: Number of classes.

    Equality is identity (comparing arrays element-wise would be ambiguous); compare the
    arrays with ``np.array_equal`` instead.
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int

    def __post_init__(self) -> None:
        for x, y in ((self.X_train, self.y_train), (self.X_test, self.y_test)):
            assert x.dtype == np.float32 and y.dtype == np.int64, (x.dtype, y.dtype)
            assert y.ndim == 1 and len(x) == len(y), (x.shape, y.shape)
        assert self.X_train.shape[1:] == self.X_test.shape[1:]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, without the batch dimension, e.g. ``(40,)`` for mnist1d."""
        return tuple(int(s) for s in self.X_train.shape[1:])

    def digest(self) -> str:
        """The first 12 hex digits of a SHA-256 over the four arrays (their dtypes, shapes and
        bytes): equal for equal data, so runs can show which data they trained on."""
        h = hashlib.sha256()
        for a in (self.X_train, self.y_train, self.X_test, self.y_test):
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:12]

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, n_train={len(self.y_train)}, "
            f"n_test={len(self.y_test)}, input_shape={self.input_shape}, "
            f"n_classes={self.n_classes})"
        )


def default_cache_dir() -> Path:
    """Directory where generated datasets are cached: ``$DAMPTUNE_CACHE`` or ``~/.cache/damptune``.

    Returns:
        The directory (it may not exist yet).
    """
    env = os.environ.get("DAMPTUNE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "damptune"


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    n_samples: int | None = None,
) -> Dataset:
    """Load (or build locally) a dataset by name; nothing is ever downloaded.

    Args:
        name: One of :data:`DATASETS`:

            - ``"mnist1d"``: MNIST-1D generated with the ``mnist1d`` package's ``make_dataset``
              and its default arguments (40 features, 10 classes, 5000 examples split 4000/1000,
              standardized by the generator), seeded with ``seed``. Cached as ``.npz`` under
              ``root`` if given, else :func:`default_cache_dir`.
            - ``"digits"``: scikit-learn's bundled 8x8 digits, shape ``(N, 1, 8, 8)`` scaled to
              ``[0, 1]``, split 80/20 by a permutation drawn from ``seed``.
            - ``"synthetic"``: 10 Gaussian blobs in 20 dimensions (2000 examples by default),
              split 80/20, features standardized with the training statistics.
            - ``"cifar10"``: CIFAR-10 read from ``root`` (the python-version batches), shape
              ``(N, 3, 32, 32)`` normalized per channel; the split is the official one.
        seed: Seed of the generation (mnist1d, synthetic) and of the train/test split (digits,
            synthetic). The same seed gives the same arrays.
        root: For ``cifar10``, the directory holding ``data_batch_1`` ... ``data_batch_5`` and
            ``test_batch``, or their ``cifar-10-batches-py`` folder. For ``mnist1d``, the cache
            directory. Ignored otherwise.
        n_samples: Total number of examples before the 80/20 split, for ``mnist1d`` (rounded
            down to a multiple of 10 by the generator), ``synthetic`` and ``digits`` (a seeded
            subset of the 1797); None keeps the default size. Not accepted for ``cifar10``.

    Returns:
        The dataset, with float32 inputs and int64 labels.

    Raises:
        ValueError: If ``name`` is not one of :data:`DATASETS`, ``n_samples`` is out of range,
            or ``cifar10`` is asked for without a directory that holds its files.

    Example:
        >>> data = load_dataset("digits", seed=0)
        >>> data.input_shape, data.n_classes, len(data.y_train), len(data.y_test)
        ((1, 8, 8), 10, 1438, 359)
    """
    seed = _check_seed(seed)
    if name == "mnist1d":
        return _load_mnist1d(seed=seed, cache_dir=root, n_samples=n_samples)
    if name == "digits":
        return _load_digits(seed=seed, n_samples=n_samples)
    if name == "synthetic":
        return _load_synthetic(seed=seed, n_samples=n_samples)
    if name == "cifar10":
        if n_samples is not None:
            raise ValueError(
                f"n_samples={n_samples!r} is not accepted for dataset='cifar10'; expected None "
                "(CIFAR-10 keeps its official 50000/10000 split). Subsample the arrays yourself."
            )
        return _load_cifar10(root)
    raise ValueError(
        f"dataset={name!r} is not accepted; expected one of {', '.join(map(repr, DATASETS))}."
    )


def check_dataset(name: str, *, root: str | os.PathLike[str] | None = None) -> None:
    """Raise what :func:`load_dataset` would raise for want of its files, without building
    the arrays: for ``cifar10``, that ``root`` holds the six python batches and each one reads
    as a CIFAR-10 batch (unpickled, shapes and labels checked; no float conversion). The
    other datasets are built locally: nothing to check.

    Raises:
        ValueError: If ``name`` is unknown, or ``cifar10``'s ``root`` is missing, is not a
            directory, or lacks or holds unreadable batches (the message names ``root``).
    """
    if name not in DATASETS:
        raise ValueError(
            f"dataset={name!r} is not accepted; expected one of {', '.join(map(repr, DATASETS))}."
        )
    if name == "cifar10":
        directory = _find_cifar_dir(root)
        for batch in (*_CIFAR_TRAIN, _CIFAR_TEST):
            _read_cifar_batch(directory / batch, root)


# --------------------------------------------------------------------------------------------
# Helpers


def _check_seed(seed: object) -> int:
    if (
        isinstance(seed, bool)
        or not isinstance(seed, int | np.integer)
        or not (0 <= int(seed) < 2**32)
    ):
        raise ValueError(f"seed={seed!r} is not accepted; expected an int in [0, 2**32).")
    return int(seed)


def _check_n_samples(n_samples: object, *, minimum: int, maximum: int | None = None) -> int:
    n = None
    if not isinstance(n_samples, bool) and isinstance(n_samples, int | np.integer):
        n = int(n_samples)
    if n is None or n < minimum or (maximum is not None and n > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(
            f"n_samples={n_samples!r} is not accepted; expected None or an int >= {minimum}"
            f"{upper} (total examples before the train/test split)."
        )
    return n


def _split(
    name: str, X: np.ndarray, y: np.ndarray, *, n_classes: int, rng: np.random.Generator
) -> Dataset:
    """Shuffle with ``rng`` and hold out the last ``_TEST_FRACTION`` as the test set."""
    perm = rng.permutation(len(y))
    n_train = len(y) - max(1, round(_TEST_FRACTION * len(y)))
    train, test = perm[:n_train], perm[n_train:]
    return Dataset(
        name=name,
        X_train=np.ascontiguousarray(X[train], dtype=np.float32),
        y_train=np.ascontiguousarray(y[train], dtype=np.int64),
        X_test=np.ascontiguousarray(X[test], dtype=np.float32),
        y_test=np.ascontiguousarray(y[test], dtype=np.int64),
        n_classes=n_classes,
    )


# --------------------------------------------------------------------------------------------
# mnist1d


def _load_mnist1d(
    *, seed: int, cache_dir: str | os.PathLike[str] | None, n_samples: int | None
) -> Dataset:
    from mnist1d.data import get_dataset_args

    try:
        mnist1d_version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:  # imported from a source checkout
        mnist1d_version = "unknown"

    args: dict[str, Any] = get_dataset_args(as_dict=True)
    args.pop("url", None)  # the download path is never used
    args["seed"] = seed
    if n_samples is not None:
        args["num_samples"] = _check_n_samples(n_samples, minimum=20)
    key = hashlib.sha256(
        json.dumps({"args": args, "mnist1d": mnist1d_version}, sort_keys=True).encode()
    ).hexdigest()[:16]
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = directory / f"mnist1d-seed{seed}-{key}.npz"

    arrays = _read_npz(path)
    if arrays is None:
        with _GENERATION_LOCK:
            arrays = _read_npz(path)  # another thread of this process may have made it
            if arrays is None:
                arrays = _generate_mnist1d(args)
                _write_npz_atomically(path, arrays)
    return Dataset(name="mnist1d", n_classes=10, **arrays)


# make_dataset seeds and draws from the process-wide `random` and `np.random` states: two
# threads generating at once (the cells of a grid on a machine with a cold cache) would
# interleave their draws and both get other data than their seed's. One at a time.
_GENERATION_LOCK = threading.RLock()


def _generate_mnist1d(args: dict[str, Any]) -> dict[str, np.ndarray]:
    """Run ``mnist1d.data.make_dataset`` without disturbing the global random states."""
    from mnist1d import data as mnist1d_data
    from mnist1d.utils import ObjectView

    # make_dataset seeds the global `random` and `np.random` states; put them back afterwards.
    with _GENERATION_LOCK:
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            raw = mnist1d_data.make_dataset(ObjectView(dict(args)))
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
    return {
        "X_train": np.ascontiguousarray(raw["x"], dtype=np.float32),
        "y_train": np.ascontiguousarray(raw["y"], dtype=np.int64),
        "X_test": np.ascontiguousarray(raw["x_test"], dtype=np.float32),
        "y_test": np.ascontiguousarray(raw["y_test"], dtype=np.int64),
    }


_NPZ_KEYS = ("X_train", "y_train", "X_test", "y_test")


def _read_npz(path: Path) -> dict[str, np.ndarray] | None:
    """Return the cached arrays, or None if the file is absent or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in _NPZ_KEYS}
    except Exception as exc:  # a corrupt cache is rebuilt, whatever the cause
        warnings.warn(f"ignoring unreadable dataset cache {path}: {exc!r}", stacklevel=4)
        return None
    expected = {
        "X_train": np.float32,
        "y_train": np.int64,
        "X_test": np.float32,
        "y_test": np.int64,
    }
    if any(arrays[k].dtype != t for k, t in expected.items()):
        return None
    return arrays


def _write_npz_atomically(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` via a temporary file and ``os.replace``; warn on failure."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        warnings.warn(
            f"could not cache the dataset at {path} ({exc}); it will be generated again next "
            "time. Set DAMPTUNE_CACHE to a writable directory.",
            stacklevel=4,
        )
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# digits and synthetic


def _load_digits(*, seed: int, n_samples: int | None) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()  # bundled with scikit-learn: no download
    X = (bunch.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    if n_samples is not None:
        n = _check_n_samples(n_samples, minimum=2, maximum=len(y))
        keep = np.sort(rng.permutation(len(y))[:n])
        X, y = X[keep], y[keep]
    return _split("digits", X, y, n_classes=10, rng=rng)


def _load_synthetic(*, seed: int, n_samples: int | None) -> Dataset:
    from sklearn.datasets import make_blobs

    n = _SYNTHETIC_SAMPLES if n_samples is None else _check_n_samples(n_samples, minimum=2)
    X, y = make_blobs(
        n_samples=n,
        n_features=_SYNTHETIC_FEATURES,
        centers=_SYNTHETIC_CLASSES,
        cluster_std=_SYNTHETIC_STD,
        random_state=seed,
    )
    data = _split("synthetic", X, y, n_classes=_SYNTHETIC_CLASSES, rng=np.random.default_rng(seed))
    mean = data.X_train.mean(axis=0)
    std = data.X_train.std(axis=0) + 1e-6
    data.X_train[...] = (data.X_train - mean) / std
    data.X_test[...] = (data.X_test - mean) / std
    return data


# --------------------------------------------------------------------------------------------
# cifar10


def _cifar_error(root: object, problem: str) -> ValueError:
    files = ", ".join((*_CIFAR_TRAIN, _CIFAR_TEST))
    return ValueError(
        f"root={root!r} is not accepted for dataset='cifar10': {problem}. Expected a local "
        f"directory holding the CIFAR-10 python-version batches ({files}), either directly or "
        f"in its '{_CIFAR_SUBDIR}' subfolder. damptune never downloads data: get "
        "cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) yourself, "
        "extract it, and pass the directory as root."
    )


def _find_cifar_dir(root: str | os.PathLike[str] | None) -> Path:
    if root is None:
        raise _cifar_error(root, "no directory was given")
    base = Path(root).expanduser()
    if not base.is_dir():
        raise _cifar_error(root, "it is not an existing directory")
    needed = (*_CIFAR_TRAIN, _CIFAR_TEST)
    for candidate in (base, base / _CIFAR_SUBDIR):
        if all((candidate / f).is_file() for f in needed):
            return candidate
    present = base / _CIFAR_SUBDIR if (base / _CIFAR_SUBDIR).is_dir() else base
    missing = [f for f in needed if not (present / f).is_file()]
    raise _cifar_error(root, f"{present} lacks {', '.join(missing)}")


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that only builds what a CIFAR-10 batch holds (dicts, lists, numpy arrays)."""

    _ALLOWED = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR-10 batch")
        return super().find_class(module, name)


def _read_cifar_batch(path: Path, root: object) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise _cifar_error(root, f"{path} is not a CIFAR-10 python batch ({exc!r})") from exc
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (len(data),):
        raise _cifar_error(
            root,
            f"{path} holds data of shape {data.shape} and {labels.size} labels, expected "
            "(n, 3072) and n",
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise _cifar_error(root, f"{path} holds labels outside 0..9")
    return data, labels


def _load_cifar10(root: str | os.PathLike[str] | None) -> Dataset:
    directory = _find_cifar_dir(root)

    def images(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        parts = [_read_cifar_batch(directory / n, root) for n in names]
        raw = np.concatenate([d for d, _ in parts]).reshape(-1, 3, 32, 32)
        X = raw.astype(np.float32)
        X *= 1.0 / 255.0
        X -= _CIFAR_MEAN[:, None, None]
        X /= _CIFAR_STD[:, None, None]
        return X, np.concatenate([lab for _, lab in parts])

    X_train, y_train = images(_CIFAR_TRAIN)
    X_test, y_test = images((_CIFAR_TEST,))
    return Dataset(
        name="cifar10",
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test=y_test,
        n_classes=10,
    )
