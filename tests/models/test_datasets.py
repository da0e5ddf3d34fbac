from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

from models import DATASETS, Dataset, check_dataset, load_dataset
from tests.threads import OK, run_in_threads

SMALL = 200  # mnist1d examples for the tests that generate several datasets


def _arrays(data: Dataset) -> tuple[np.ndarray, ...]:
    return data.X_train, data.y_train, data.X_test, data.y_test


def _same(a: Dataset, b: Dataset) -> bool:
    return all(np.array_equal(u, v) for u, v in zip(_arrays(a), _arrays(b), strict=True))


@pytest.mark.parametrize(
    ("name", "input_shape", "n_train", "n_test"),
    [
        ("mnist1d", (40,), 4000, 1000),
        ("digits", (1, 8, 8), 1438, 359),
        ("synthetic", (20,), 1600, 400),
    ],
)
def test_load_dataset_has_documented_shapes_and_dtypes(name, input_shape, n_train, n_test):
    data = load_dataset(name, seed=0)

    assert data.name == name and data.n_classes == 10
    assert data.input_shape == input_shape
    assert data.X_train.shape == (n_train, *input_shape)
    assert data.X_test.shape == (n_test, *input_shape)
    assert data.X_train.dtype == data.X_test.dtype == np.float32
    assert data.y_train.dtype == data.y_test.dtype == np.int64
    assert set(np.unique(data.y_train)) == set(range(10))
    assert np.isfinite(data.X_train).all()


def test_load_dataset_digits_are_scaled_to_unit_interval():
    data = load_dataset("digits")

    assert data.X_train.min() == 0.0 and data.X_train.max() == 1.0


def test_load_dataset_mnist1d_is_standardized_like_the_generator_does():
    data = load_dataset("mnist1d")

    assert abs(float(data.X_train.mean())) < 0.05
    assert abs(float(data.X_train.std()) - 1.0) < 0.05


@pytest.mark.parametrize("name", ["mnist1d", "digits", "synthetic"])
def test_load_dataset_same_seed_same_arrays_other_seed_other_arrays(name, tmp_path):
    # Separate cache directories, so that mnist1d is generated each time, not read back.
    def load(seed, sub):
        return load_dataset(name, seed=seed, n_samples=SMALL, root=tmp_path / sub)

    first, again, other = load(1, "a"), load(1, "b"), load(2, "c")

    assert _same(first, again)
    assert not np.array_equal(first.X_train, other.X_train)
    assert first.digest() == again.digest() != other.digest()  # what MLflow shows per trial
    assert len(first.digest()) == 12 and int(first.digest(), 16) >= 0


def test_load_dataset_n_samples_sets_the_total_before_an_80_20_split():
    data = load_dataset("synthetic", n_samples=500)

    assert (len(data.y_train), len(data.y_test)) == (400, 100)


def test_load_dataset_mnist1d_cache_hit_returns_identical_arrays(tmp_path, monkeypatch):
    import mnist1d.data

    first = load_dataset("mnist1d", seed=3, n_samples=SMALL, root=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())

    def fail(*args, **kwargs):
        raise AssertionError("make_dataset was called although the dataset is cached")

    monkeypatch.setattr(mnist1d.data, "make_dataset", fail)
    second = load_dataset("mnist1d", seed=3, n_samples=SMALL, root=tmp_path)

    assert len(files) == 1 and files[0].endswith(".npz")  # no temporary file left behind
    assert _same(first, second)


def test_load_dataset_mnist1d_uses_damptune_cache_env_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("DAMPTUNE_CACHE", str(tmp_path))

    load_dataset("mnist1d", seed=4, n_samples=SMALL)

    assert len(list(tmp_path.glob("mnist1d-seed4-*.npz"))) == 1


def test_load_dataset_mnist1d_rebuilds_a_corrupt_cache(tmp_path):
    first = load_dataset("mnist1d", seed=5, n_samples=SMALL, root=tmp_path)
    (cached,) = tmp_path.iterdir()
    cached.write_bytes(b"not a zip file")

    with pytest.warns(UserWarning, match="unreadable dataset cache"):
        second = load_dataset("mnist1d", seed=5, n_samples=SMALL, root=tmp_path)

    assert _same(first, second)


def test_load_dataset_mnist1d_leaves_global_random_state_alone(tmp_path):
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)

    load_dataset("mnist1d", seed=6, n_samples=SMALL, root=tmp_path)

    assert np.random.rand() == expected


def test_load_dataset_unknown_name_names_parameter_value_and_accepted():
    with pytest.raises(ValueError, match="^dataset='mnist'") as excinfo:
        load_dataset("mnist")

    assert all(repr(name) in str(excinfo.value) for name in DATASETS)


def test_dataset_repr_shows_sizes_not_arrays():
    text = repr(load_dataset("synthetic", n_samples=100))

    assert text == (
        "Dataset(name='synthetic', n_train=80, n_test=20, input_shape=(20,), n_classes=10)"
    )


# --- cifar10 ---------------------------------------------------------------------------------

N_PER_BATCH = 3


def _write_fake_cifar(directory, *, rng):
    """Write the six CIFAR-10 python batches, tiny, in the real files' pickle format."""
    directory.mkdir(parents=True, exist_ok=True)
    batches = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        data = rng.integers(0, 256, size=(N_PER_BATCH, 3072), dtype=np.uint8)
        labels = [(i + j) % 10 for j in range(N_PER_BATCH)]
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img{j}.png".encode() for j in range(N_PER_BATCH)],
        }
        # The real files were pickled by Python 2 (protocol 2) with numpy.core paths.
        raw = pickle.dumps(batch, protocol=2)
        raw = raw.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
        (directory / name).write_bytes(raw)
        batches[name] = (data, labels)
    return batches


@pytest.mark.parametrize("subfolder", ["", "cifar-10-batches-py"])
def test_load_dataset_cifar10_reads_the_python_batches(tmp_path, subfolder):
    batches = _write_fake_cifar(
        tmp_path / subfolder if subfolder else tmp_path, rng=np.random.default_rng(0)
    )

    data = load_dataset("cifar10", root=str(tmp_path))

    assert data.input_shape == (3, 32, 32) and data.n_classes == 10
    assert data.X_train.shape == (5 * N_PER_BATCH, 3, 32, 32)
    assert data.X_test.shape == (N_PER_BATCH, 3, 32, 32)
    assert data.X_train.dtype == np.float32 and data.y_train.dtype == np.int64
    raw, labels = batches["test_batch"]
    assert data.y_test.tolist() == labels
    pixel = raw[1].reshape(3, 32, 32)[2, 5, 7] / 255.0  # channel 2, row 5, column 7
    assert data.X_test[1, 2, 5, 7] == pytest.approx((pixel - 0.4465) / 0.2616, abs=1e-5)
    expected_train = np.concatenate([batches[f"data_batch_{k}"][1] for k in range(1, 6)])
    assert data.y_train.tolist() == expected_train.tolist()


@pytest.mark.parametrize("root", [None, "does/not/exist"])
def test_load_dataset_cifar10_without_files_says_what_root_must_hold(root):
    with pytest.raises(ValueError) as excinfo:
        load_dataset("cifar10", root=root)

    message = str(excinfo.value)
    assert message.startswith(f"root={root!r}")
    assert "data_batch_1" in message and "test_batch" in message
    assert "cifar-10-batches-py" in message
    assert "never downloads" in message


def test_load_dataset_cifar10_names_the_missing_files(tmp_path):
    _write_fake_cifar(tmp_path, rng=np.random.default_rng(0))
    (tmp_path / "data_batch_3").unlink()

    with pytest.raises(ValueError, match="lacks data_batch_3"):
        load_dataset("cifar10", root=tmp_path)


def test_load_dataset_cifar10_refuses_to_run_code_from_a_pickle(tmp_path):
    _write_fake_cifar(tmp_path, rng=np.random.default_rng(0))
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": Exploit()}, protocol=2))

    with pytest.raises(ValueError, match="not a CIFAR-10 python batch"):
        load_dataset("cifar10", root=tmp_path)
    assert not marker.exists()


def test_load_dataset_cifar10_rejects_n_samples(tmp_path):
    _write_fake_cifar(tmp_path, rng=np.random.default_rng(0))

    with pytest.raises(ValueError, match="^n_samples=10"):
        load_dataset("cifar10", root=tmp_path, n_samples=10)


def test_load_dataset_loads_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("digits")


def test_load_dataset_mnist1d_generated_by_threads_at_once_is_each_seeds_data(tmp_path):
    """The cells of a grid load the dataset at once on a machine with a cold cache; the
    generator seeds and draws from process-wide random states, so unguarded threads would
    interleave their draws and get other data. (Found as a rerun "on another machine" whose
    trials differed from the clean run's.)"""
    import threading

    expected = {seed: load_dataset("mnist1d", seed=seed, n_samples=SMALL,
                                   root=tmp_path / "alone") for seed in (0, 1)}
    got: dict[tuple[int, int], Dataset] = {}
    start = threading.Barrier(4)

    def load(i: int, seed: int) -> None:
        start.wait()
        got[i, seed] = load_dataset("mnist1d", seed=seed, n_samples=SMALL,
                                    root=tmp_path / f"cold{i}")

    outcomes = run_in_threads([lambda i=i, seed=seed: load(i, seed)
                               for i in (0, 1) for seed in (0, 1)])
    assert outcomes == [OK] * 4, outcomes  # every thread ended, none raised
    assert sorted(got) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # all 4 loads returned
    assert all(_same(data, expected[seed]) for (_, seed), data in got.items())


def test_check_dataset_reads_the_cifar10_batches_without_building_arrays(tmp_path):
    _write_fake_cifar(tmp_path, rng=np.random.default_rng(0))
    check_dataset("cifar10", root=tmp_path)
    check_dataset("mnist1d")  # built locally: nothing to check
    (tmp_path / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"root=.*data_batch_3 is not a CIFAR-10 python batch"):
        check_dataset("cifar10", root=tmp_path)
    with pytest.raises(ValueError, match=r"root=None.*no directory was given"):
        check_dataset("cifar10")
    with pytest.raises(ValueError, match=r"dataset='imagenet'"):
        check_dataset("imagenet")


def test_dataset_digest_changes_with_any_array():
    data = load_dataset("digits", seed=0)
    for name in ("X_train", "y_train", "X_test", "y_test"):
        arrays = {k: getattr(data, k).copy() for k in ("X_train", "y_train", "X_test", "y_test")}
        arrays[name][0] = arrays[name][1] if name.startswith("y") else arrays[name][0] + 1
        if name.startswith("y") and arrays[name][0] == getattr(data, name)[0]:
            arrays[name][0] = (arrays[name][0] + 1) % data.n_classes
        changed = Dataset(name="digits", n_classes=data.n_classes, **arrays)
        assert changed.digest() != data.digest(), name
