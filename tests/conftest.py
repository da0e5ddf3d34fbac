"""Shared fixtures: a real Dask LocalCluster (4 single-threaded worker processes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory):
    """A real LocalCluster of 4 worker processes bound to 127.0.0.1, shared by the session."""
    from damptune.cluster import local_cluster

    cluster = local_cluster(n_workers=4, local_directory=str(tmp_path_factory.mktemp("dask")))
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def scheduler(dask_cluster) -> str:
    return dask_cluster.scheduler_address


@pytest.fixture(scope="session")
def blobs():
    """A small seeded 3-class problem: (X_train, y_train, X_test, y_test)."""
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=2.0, size=(3, 12))
    y = rng.integers(0, 3, size=600)
    X = (centers[y] + rng.normal(size=(600, 12))).astype("float32")
    return X[:480], y[:480], X[480:], y[480:]
